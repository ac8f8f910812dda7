"""GRPO on the conductor policy's LoRA weights: sample workflows, run them over the pool, reward, update.

Needs torch, transformers and peft (``pip install 'dspy-conductor[train]'``) through ``conductor.conductor_lm``.
"""

from conductor.optimizers._checkpoint import Checkpoint, checkpoints
from conductor.optimizers._rollouts import ProcessorFactory
from conductor.optimizers.grpo._actors import RolloutSetup
from conductor.optimizers.grpo._config import GRPOConfig, load_config
from conductor.optimizers.grpo._loss import LossOutput, group_advantages, grpo_loss
from conductor.optimizers.grpo._metrics import StepMetrics
from conductor.optimizers.grpo._rollouts import Rollout, random_pool
from conductor.optimizers.grpo._trainer import GRPOTrainer

__all__ = [
    "Checkpoint",
    "GRPOConfig",
    "GRPOTrainer",
    "LossOutput",
    "ProcessorFactory",
    "Rollout",
    "RolloutSetup",
    "StepMetrics",
    "checkpoints",
    "group_advantages",
    "grpo_loss",
    "load_config",
    "random_pool",
]
