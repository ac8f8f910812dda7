"""The generation stack's two plan choices, on the tiny random policy: how rows that share a prompt hold its cache
(``prompt_cache``), and whether different prompts share a pass over their common prefix (``common_prefix``). The
benchmarks compare their speed; here, that the choices agree on the result."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.conductor_lm import ConductorLM  # noqa: E402

QUESTIONS = ["What is 17 + 25?", "Name the capital of France.", "Spell the word orchestra backwards."]


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """One torch thread (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def tiny() -> ConductorLM:
    return ConductorLM.tiny(seed=0)


def _prompts(policy: ConductorLM) -> list[list[int]]:
    system = {"role": "system", "content": "You write workflows for a pool of three workers. " * 4}
    return [policy.encode([system, {"role": "user", "content": q}]) for q in QUESTIONS]


def test_a_growing_prompt_cache_samples_what_the_preallocated_one_does(tiny: ConductorLM) -> None:
    options = {"max_new_tokens": 10, "temperature": 0}
    static = tiny.sample(QUESTIONS, 3, **options)
    dynamic = tiny.sample(QUESTIONS, 3, **options, prompt_cache="dynamic")
    for ours, theirs in zip(static, dynamic, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            assert a.token_ids == b.token_ids and a.text == b.text
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_an_unknown_prompt_cache_is_refused(tiny: ConductorLM) -> None:
    with pytest.raises(ValueError, match="prompt_cache"):
        tiny.sample(QUESTIONS, 2, max_new_tokens=4, prompt_cache="paged")  # type: ignore[arg-type]


def test_scoring_after_the_common_prefix_or_per_prompt_gives_the_same_logprobs(tiny: ConductorLM) -> None:
    prompts = _prompts(tiny)
    completions = [tiny.tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("abc", "de", "fghij")]
    shared = tiny.sequence_logprobs(prompts, completions)
    alone = tiny.sequence_logprobs(prompts, completions, common_prefix=False)
    for a, b in zip(shared, alone, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
