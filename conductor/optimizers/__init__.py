"""Optimizers for conductor programs: rewards, GRPO on the conductor's weights, prompt search, budget tuning."""

from conductor.optimizers._rewards import Reward, RewardConfig, score

__all__ = ["Reward", "RewardConfig", "score"]
