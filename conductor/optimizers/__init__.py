"""Optimizers for conductor programs, one method a room: program search (``search/``), the supervised warm start
(``finetune/``), expert iteration, GRPO on the conductor's weights (``grpo/``), prompt search, budget tuning, and the
compiler that alternates them; and what they share: rewards, the rollout loop (``run_and_score``), evaluation.

Importing this package needs no torch; ``GRPOConfig`` and ``GRPOTrainer`` load ``grpo`` (and torch) when first used.
"""

from conductor.optimizers._budget import BudgetSpace, BudgetTuner, TunedPoint
from conductor.optimizers._compiler import ConductorCompiler, PhaseRecord
from conductor.optimizers._evaluate import evaluate_program
from conductor.optimizers._expert_iteration import ExpertIterationConfig, ExpertIterationReport, expert_iteration
from conductor.optimizers._metric import WorkflowMetric
from conductor.optimizers._paired import PairedComparison, paired_comparison
from conductor.optimizers._prompt_search import PromptSearch, WorkflowFewShot
from conductor.optimizers._rewards import Reward, RewardConfig, score
from conductor.optimizers._rollouts import RolloutJob, ScoredRun, rollout_program, run_and_score
from conductor.optimizers.finetune import (
    TemplateStep,
    TemplateWarmStartConfig,
    WarmStartConfig,
    WarmStartReport,
    from_predictions,
    synthetic_workflows,
    templated_workflows,
    warm_start,
)
from conductor.optimizers.search import (
    Candidate,
    ProgramSearchConfig,
    SearchResult,
    candidate_space,
    program_search,
    proposed_subtasks,
    searched_workflows,
    write_search_report,
)

_NEED_TORCH = {"GRPOConfig", "GRPOTrainer"}  # from .grpo; imported on first use so this package needs no torch


def __getattr__(name: str):
    if name in _NEED_TORCH:
        from conductor.optimizers import grpo

        return getattr(grpo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BudgetSpace",
    "BudgetTuner",
    "Candidate",
    "ConductorCompiler",
    "ExpertIterationConfig",
    "ExpertIterationReport",
    "GRPOConfig",
    "GRPOTrainer",
    "PairedComparison",
    "PhaseRecord",
    "ProgramSearchConfig",
    "PromptSearch",
    "Reward",
    "RewardConfig",
    "RolloutJob",
    "ScoredRun",
    "SearchResult",
    "TemplateStep",
    "TemplateWarmStartConfig",
    "TunedPoint",
    "WarmStartConfig",
    "WarmStartReport",
    "WorkflowFewShot",
    "WorkflowMetric",
    "candidate_space",
    "evaluate_program",
    "expert_iteration",
    "from_predictions",
    "paired_comparison",
    "program_search",
    "proposed_subtasks",
    "rollout_program",
    "run_and_score",
    "score",
    "searched_workflows",
    "synthetic_workflows",
    "templated_workflows",
    "warm_start",
    "write_search_report",
]
