"""Optimizers for conductor programs: rewards, GRPO on the conductor's weights, prompt search, budget tuning."""

from conductor.optimizers._budget import BudgetSpace, BudgetTuner, TunedPoint
from conductor.optimizers._compiler import ConductorCompiler, PhaseRecord
from conductor.optimizers._evaluate import evaluate_program
from conductor.optimizers._prompt_search import PromptSearch, WorkflowFewShot, WorkflowMetric
from conductor.optimizers._rewards import Reward, RewardConfig, score
from conductor.optimizers._warm_start import (
    ExpertIterationConfig,
    ExpertIterationReport,
    TemplateStep,
    TemplateWarmStartConfig,
    WarmStartConfig,
    WarmStartReport,
    expert_iteration,
    from_predictions,
    synthetic_workflows,
    templated_workflows,
    warm_start,
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
    "ConductorCompiler",
    "ExpertIterationConfig",
    "ExpertIterationReport",
    "GRPOConfig",
    "GRPOTrainer",
    "PhaseRecord",
    "PromptSearch",
    "Reward",
    "RewardConfig",
    "TemplateStep",
    "TemplateWarmStartConfig",
    "TunedPoint",
    "WarmStartConfig",
    "WarmStartReport",
    "WorkflowFewShot",
    "WorkflowMetric",
    "evaluate_program",
    "expert_iteration",
    "from_predictions",
    "score",
    "synthetic_workflows",
    "templated_workflows",
    "warm_start",
]
