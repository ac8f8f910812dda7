"""``ConductorLM(sampling_dtype=...)``: sampling from a bf16 copy of a float32 learner, on the tiny random policy."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.conductor_lm import ConductorLM, LoraSpec  # noqa: E402
from conductor.errors import ConfigError  # noqa: E402

PROMPT = [{"role": "user", "content": "Plan the steps for 17 + 25."}]
TOLERANCE = 0.02
"""Most a bf16 sampler's log-prob of a token may differ from the float32 learner's on the tiny model (measured:
about 0.003 at most, against 1e-5 for a float32 sampler)."""


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """One torch thread (see tests/conftest.py)."""


def _policy(*, lora: bool = True) -> ConductorLM:
    """A tiny float32 policy sampling in bf16, its LoRA B matrices random so that the adapter changes the model
    (``lora=False``: every weight trainable)."""
    policy = ConductorLM.tiny(seed=0, lora=LoraSpec(r=4, alpha=8) if lora else None, sampling_dtype="bfloat16")
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, weight in policy.model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, 0.1)
    return policy


def _drift(policy: ConductorLM, samples: Sequence[Any]) -> torch.Tensor:
    """Per-token ``sampled log-prob - learner log-prob`` over ``samples``."""
    learner = policy.sequence_logprobs([s.prompt_ids for s in samples], [s.token_ids for s in samples])
    return torch.cat([torch.tensor(s.logprobs) - lp for s, lp in zip(samples, learner, strict=True)])


def _logprobs(model: Any, prompt: Sequence[int], completion: Sequence[int]) -> torch.Tensor:
    """``completion``'s token log-probs after ``prompt`` under ``model``, in one plain forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[*prompt, *completion[:-1]]])).logits[0, len(prompt) - 1 :].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(list(completion))[:, None]).squeeze(1)


def _train_step(policy: ConductorLM, samples: Sequence[Any], lr: float, *, fused: bool = False) -> None:
    """One AdamW step raising the log-probs of ``samples``, the learner in float32 as GRPO runs it."""
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, fused=fused)
    logprobs = policy.sequence_logprobs([s.prompt_ids for s in samples], [s.token_ids for s in samples], grad=True)
    (-torch.stack([lp.sum() for lp in logprobs]).sum()).backward()
    optimizer.step()


def test_the_bf16_sampler_records_log_probs_close_to_the_float32_learner() -> None:
    policy = _policy()
    samples = policy.sample([policy.encode(PROMPT)], 4, max_new_tokens=24, seed=0)[0]
    drift = _drift(policy, samples).abs()
    assert policy.sampling_model().dtype == torch.bfloat16
    assert policy.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    assert drift.max() < TOLERANCE
    assert drift.max() > 1e-4  # the samples did come from the bf16 copy (a float32 sampler agrees to about 1e-5)


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
def test_an_optimizer_step_reaches_the_sampler_copy(fused: bool) -> None:
    """Fused AdamW updates the weights without bumping torch's version counters: the copy must follow it too."""
    policy = _policy()
    prompt = policy.encode(PROMPT)
    samples = policy.sample([prompt], 4, max_new_tokens=16, seed=0)[0]
    stale = copy.deepcopy(policy.sampling_model())
    _train_step(policy, samples, lr=0.05, fused=fused)

    after = policy.sample([prompt], 4, max_new_tokens=16, seed=1)[0]
    assert _drift(policy, after).abs().max() < TOLERANCE
    learner = policy.sequence_logprobs([s.prompt_ids for s in after], [s.token_ids for s in after])
    stale_drift = torch.cat([_logprobs(stale, prompt, s.token_ids) - lp for s, lp in zip(after, learner, strict=True)])
    assert stale_drift.abs().max() > 5 * TOLERANCE  # the step moved the policy far enough that a stale copy shows


def test_the_copy_is_rebuilt_only_when_a_trainable_weight_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = _policy()
    syncs = []
    real_sync = policy._sync_sampler
    monkeypatch.setattr(policy, "_sync_sampler", lambda: syncs.append(1) or real_sync())
    prompt = policy.encode(PROMPT)
    for seed in range(2):
        policy.sample([prompt], 2, max_new_tokens=4, seed=seed)
    assert len(syncs) == 1
    with torch.no_grad():
        policy.trainable_parameters()[0].add_(0.01)
    policy.sample([prompt], 2, max_new_tokens=4, seed=0)
    assert len(syncs) == 2


def test_a_full_fine_tune_without_lora_reaches_the_sampler_too() -> None:
    policy = _policy(lora=False)
    prompt = policy.encode(PROMPT)
    samples = policy.sample([prompt], 2, max_new_tokens=8, seed=0)[0]
    _train_step(policy, samples, lr=0.01)
    sampler = policy.sampling_model()
    for name, weight in policy.model.named_parameters():
        torch.testing.assert_close(sampler.get_parameter(name), weight.detach().to(torch.bfloat16))


def test_the_base_dtype_samples_from_the_model_itself_and_a_bad_dtype_is_refused() -> None:
    policy = ConductorLM.tiny(sampling_dtype="float32")
    assert policy.sampling_dtype is None
    assert policy.sampling_model() is policy.model
    with pytest.raises(ConfigError, match="unknown dtype"):
        ConductorLM.tiny(sampling_dtype="float8")
