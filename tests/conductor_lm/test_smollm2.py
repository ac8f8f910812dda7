"""The real SmolLM2-135M-Instruct as a conductor policy (slow: loads the embedded model)."""

from __future__ import annotations

import pytest
import torch

from conductor.conductor_lm import ConductorLM
from conductor.local import DEFAULT_MODEL
from tests.conductor_lm.helpers import smollm2_or_skip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2() -> ConductorLM:
    return smollm2_or_skip()


def test_smollm2_samples_with_matching_logprobs(smollm2: ConductorLM) -> None:
    prompt = [{"role": "user", "content": "What is 17 + 25?"}]
    (row,) = smollm2.sample([prompt], 2, max_new_tokens=16, seed=0)
    assert smollm2.name == DEFAULT_MODEL and smollm2.base == DEFAULT_MODEL
    assert len(row) == 2 and all(1 <= len(s.token_ids) <= 16 for s in row)
    assert all(s.text for s in row)
    assert smollm2.tokenizer.decode(row[0].prompt_ids).endswith("<|im_start|>assistant\n")
    scored = smollm2.sequence_logprobs([s.prompt_ids for s in row], [s.token_ids for s in row])
    for s, lp in zip(row, scored, strict=True):
        assert (lp - torch.tensor(s.logprobs)).abs().max().item() < 1e-3
