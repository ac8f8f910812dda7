"""Test helpers: the embedded SmolLM2 as a policy (or a skip), and a logits processor that makes any policy write a
chosen text."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conductor.conductor_lm import ConductorLM
from conductor.errors import MissingDependency
from conductor.local import DEFAULT_MODEL, model_folder


def smollm2_or_skip(**options: Any) -> ConductorLM:
    """The embedded SmolLM2-135M-Instruct as a CPU policy (``options`` as ``from_pretrained`` takes them); the test
    is skipped when the model's package is missing."""
    try:
        model_folder(DEFAULT_MODEL)
    except MissingDependency as exc:
        pytest.skip(str(exc))
    return ConductorLM.from_pretrained(DEFAULT_MODEL, device="cpu", **options)


class ForceText:
    """Forces generation to produce ``text`` and then end-of-sequence; works across calls and batch rows.

    A new generation is recognised when the input is not one token longer than at the previous step.
    """

    def __init__(self, policy: ConductorLM, text: str):
        self.ids = [*policy.tokenizer(text, add_special_tokens=False)["input_ids"], min(policy.eos_ids)]
        self.start = 0
        self.last: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if self.last is None or length != self.last + 1:
            self.start = length
        self.last = length
        target = self.ids[min(length - self.start, len(self.ids) - 1)]
        forced = torch.full_like(scores, float("-inf"))
        forced[:, target] = 0.0
        return forced
