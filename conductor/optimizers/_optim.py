"""AdamW with a warmup schedule, and one optimizer step: what the warm start and the GRPO trainer share.

Importing this module needs no torch; making an optimizer does.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Schedule = Literal["cosine", "constant"]


def adamw_with_warmup(
    params: Sequence[torch.nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    steps: int,
    warmup_ratio: float,
    schedule: Schedule = "cosine",
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` and its learning-rate schedule over ``steps`` optimizer steps: a linear warmup over
    the first ``warmup_ratio`` of them (rounded up), then cosine decay towards 0 or a constant ``lr``."""
    import torch

    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warmup = math.ceil(warmup_ratio * steps)
    factor = functools.partial(_lr_factor, warmup=warmup, steps=steps, schedule=schedule)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _lr_factor(step: int, warmup: int, steps: int, schedule: Schedule) -> float:
    """The share of the peak learning rate that optimizer step ``step`` (from 0) uses. The warmup reaches
    ``(step + 1) / (warmup + 1)``, never 0: transformers' warmup starts at 0, which leaves a run of one step (or a
    short run's only step with a gradient) not learning at all. After it, the same as transformers' schedules."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, steps - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    params: Sequence[torch.nn.Parameter],
    max_grad_norm: float | None,
) -> float:
    """Clip the gradients to ``max_grad_norm`` (``None``: no clipping), step the optimizer and the schedule, clear
    the gradients; returns the gradient norm before clipping. A parameter without a gradient steps on zeros (AdamW's
    momentum still moves it), as it would had its gradient been computed."""
    import torch

    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    norm = torch.nn.utils.clip_grad_norm_(params, math.inf if max_grad_norm is None else max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm.item()
