"""The GRPO objective: group-normalised advantages and the PPO-style clipped surrogate, optionally minus a KL term.

Both are small pure functions on tensors, so they can be checked against hand-computed numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within each row of ``rewards`` (examples x G): a rollout is judged only against
    the other rollouts of the same example, so easy and hard examples weigh alike. A group whose rewards are all
    equal gets zeros (nothing to learn from it), never NaN."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


class LossOutput(NamedTuple):
    """The loss to minimise and what it was made of (for the metrics)."""

    loss: torch.Tensor
    clip_fraction: float
    """Share of tokens whose ratio left [1 - clip, 1 + clip] in the direction the clip stops."""
    kl: float
    """Mean per-token KL estimate to the reference (0 without one)."""


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float = 0.2,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """The negative clipped surrogate ``min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)``, per token, minus
    ``beta`` times the k3 estimate of KL(policy || reference); averaged over each sequence's tokens, then over
    sequences (as in DeepSeekMath's GRPO).

    ``logprobs`` (with a graph), ``old_logprobs`` (the weights that sampled) and ``ref_logprobs`` are
    ``(sequences, tokens)``, right-padded; ``mask`` is 1 on real tokens; ``advantages`` has one value per sequence.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    advantage = advantages.unsqueeze(1)
    unclipped = ratio * advantage
    clipped = ratio.clamp(1 - clip, 1 + clip) * advantage
    objective = torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(objective)
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, never negative
        objective = objective - beta * kl
    tokens = mask.sum(dim=1).clamp(min=1)
    per_sequence = (objective * mask).sum(dim=1) / tokens
    real = mask.bool()
    was_clipped = (clipped < unclipped) & real
    return LossOutput(
        loss=-per_sequence.mean(),
        clip_fraction=(was_clipped.sum() / real.sum().clamp(min=1)).item(),
        kl=((kl * mask).sum() / mask.sum().clamp(min=1)).item(),
    )


def pad(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D tensors into ``(rows, longest)``, with the mask of real entries."""
    padded = torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True)
    lengths = torch.tensor([len(r) for r in rows], device=padded.device)
    mask = (torch.arange(padded.shape[1], device=padded.device) < lengths.unsqueeze(1)).to(padded.dtype)
    return padded, mask
