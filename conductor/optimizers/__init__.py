"""Optimizers for conductor programs: rewards, GRPO on the conductor's weights, prompt search, budget tuning."""

from conductor.optimizers._budget import BudgetSpace, BudgetTuner, TunedPoint
from conductor.optimizers._prompt_search import PromptSearch, WorkflowFewShot, WorkflowMetric
from conductor.optimizers._rewards import Reward, RewardConfig, score

__all__ = [
    "BudgetSpace",
    "BudgetTuner",
    "PromptSearch",
    "Reward",
    "RewardConfig",
    "TunedPoint",
    "WorkflowFewShot",
    "WorkflowMetric",
    "score",
]
