"""The conductor policy on the tiny random model: sampling, log-probs, LoRA training, save/load and merging."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conductor.conductor_lm import CONFIG_NAME, ConductorLM, LoraSpec, Sample
from conductor.errors import ConductorError
from tests.conductor_lm.helpers import ForceText

PROMPTS = ["Question: 1+1?", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Plan it."}]]


def _flat(samples: list[list[Sample]]) -> list[Sample]:
    return [s for row in samples for s in row]


def _gradients(policy: ConductorLM, scores: list[torch.Tensor]) -> list[torch.Tensor]:
    """The trainable weights' gradients of the summed ``scores``."""
    policy.model.zero_grad()
    torch.stack([s.sum() for s in scores]).sum().backward()
    return [p.grad.clone() for p in policy.trainable_parameters()]


# --- sampling ----------------------------------------------------------------------------------------------------


def test_sample_shapes_and_fields(tiny: ConductorLM) -> None:
    samples = tiny.sample(PROMPTS, 3, max_new_tokens=6, seed=0)
    assert [len(row) for row in samples] == [3, 3]
    for prompt, row in zip(PROMPTS, samples, strict=True):
        for s in row:
            assert list(s.prompt_ids) == tiny.encode(prompt)
            assert 1 <= len(s.token_ids) == len(s.logprobs) <= 6
            assert all(lp <= 0 for lp in s.logprobs)
            assert s.finish_reason in ("stop", "length")
            assert s.logprob == pytest.approx(sum(s.logprobs))
    assert tiny.encode(samples[1][0].prompt_ids) == list(samples[1][0].prompt_ids)  # token ids are prompts too
    # chat messages go through the ChatML template, with the generation prompt
    rendered = tiny.tokenizer.decode(samples[1][0].prompt_ids)
    assert (
        rendered
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nPlan it.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_seed_makes_sampling_reproducible_without_touching_the_global_rng(tiny: ConductorLM) -> None:
    state = torch.get_rng_state()
    first = tiny.sample(PROMPTS, 2, max_new_tokens=8, seed=7)
    assert torch.equal(state, torch.get_rng_state())
    assert tiny.sample(PROMPTS, 2, max_new_tokens=8, seed=7) == first
    other = tiny.sample(PROMPTS, 2, max_new_tokens=8, seed=8)
    assert [s.token_ids for s in _flat(other)] != [s.token_ids for s in _flat(first)]
    # rows of one prompt differ from each other (they are independent samples)
    assert first[0][0].token_ids != first[0][1].token_ids


def test_greedy_is_deterministic_and_batch_size_does_not_change_it(tiny: ConductorLM) -> None:
    whole = tiny.sample(PROMPTS, 2, max_new_tokens=8, temperature=0)
    chunked = tiny.sample(PROMPTS, 2, max_new_tokens=8, temperature=0, batch_size=1)
    assert [s.token_ids for s in _flat(whole)] == [s.token_ids for s in _flat(chunked)]
    assert whole[0][0].token_ids == whole[0][1].token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_sequence_logprobs(tiny: ConductorLM, temperature: float) -> None:
    # train the adapter a little first, so LoRA is not a no-op
    _train(tiny, tiny.encode(PROMPTS[0]), tiny.tokenizer("abc", add_special_tokens=False)["input_ids"], steps=2)
    samples = _flat(tiny.sample(PROMPTS, 3, max_new_tokens=12, temperature=temperature, seed=3))
    scored = tiny.sequence_logprobs(
        [s.prompt_ids for s in samples], [s.token_ids for s in samples], temperature=temperature
    )
    for s, lp in zip(samples, scored, strict=True):
        assert lp.dtype == torch.float32 and lp.shape == (len(s.token_ids),)
        assert (lp - torch.tensor(s.logprobs)).abs().max().item() < 1e-4
    one = tiny.sequence_logprobs(list(samples[0].prompt_ids), list(samples[0].token_ids))
    assert isinstance(one, torch.Tensor) and one.shape == (len(samples[0].token_ids),)


def test_completions_sharing_a_prompt_score_and_train_as_if_scored_alone(tiny: ConductorLM) -> None:
    _train(tiny, tiny.encode(PROMPTS[0]), tiny.tokenizer("abc", add_special_tokens=False)["input_ids"], steps=2)
    prompt = tiny.encode(PROMPTS[0])
    # uneven lengths (right padding), an empty one, and one twice (scored once, its gradient counted twice)
    texts = ["a", "model_id = [1]", "x y", "", "model_id = [1]"]
    completions = [tiny.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    together = tiny.sequence_logprobs([prompt] * len(texts), completions, grad=True)
    alone = [tiny.sequence_logprobs(prompt, c, grad=True) for c in completions]
    assert [len(t) for t in together] == [len(c) for c in completions]
    assert together[4] is together[1]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(_gradients(tiny, together), _gradients(tiny, alone), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    chunked = tiny.sequence_logprobs([prompt] * len(texts), completions, batch_size=2)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(chunked, together, strict=True))


def test_different_prompts_score_after_their_common_prefix_as_if_scored_alone(tiny: ConductorLM) -> None:
    """A warm-start batch: questions whose prompts differ only at the end are scored after one pass over what they
    share (the cheaper plan here), with the same log-probs and gradients as one pass per pair."""
    from conductor.local._generate import _passes

    _train(tiny, tiny.encode(PROMPTS[0]), tiny.tokenizer("abc", add_special_tokens=False)["input_ids"], steps=2)
    system = {"role": "system", "content": "You write workflows for a pool of three workers. " * 4}
    prompts = [tiny.encode([system, {"role": "user", "content": q}]) for q in ("Add 3 and 5.", "Spell 'cat'.", "Hi")]
    completions = [tiny.tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("a b", "model_id = [1]", "")]
    passes = _passes(prompts, completions, [0, 1])
    assert len(passes) == 1 and 0 < len(passes[0][0]) < min(map(len, prompts))  # one pass, after the shared part
    groups = [i for i in range(3) for _ in range(16)]  # a GRPO batch: 16 completions a prompt, a pass per prompt
    assert len(_passes([prompts[i] for i in groups], [completions[1]] * len(groups), list(range(len(groups))))) == 3

    together = tiny.sequence_logprobs(prompts, completions, grad=True)
    alone = [tiny.sequence_logprobs(p, c, grad=True) for p, c in zip(prompts, completions, strict=True)]
    assert [len(t) for t in together] == [len(c) for c in completions]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(_gradients(tiny, together), _gradients(tiny, alone), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_top_p_logprobs_are_those_of_the_truncated_distribution(tiny: ConductorLM) -> None:
    samples = _flat(tiny.sample(PROMPTS, 2, max_new_tokens=8, top_p=0.3, seed=1))
    full = tiny.sequence_logprobs([s.prompt_ids for s in samples], [s.token_ids for s in samples])
    for s, lp in zip(samples, full, strict=True):
        assert all(a > b for a, b in zip(s.logprobs, lp.tolist(), strict=True))  # renormalised over fewer tokens


def test_end_of_sequence_and_stop_strings(tiny: ConductorLM) -> None:
    (sample,) = tiny.sample(["x"], 1, max_new_tokens=20, logits_processor=ForceText(tiny, "done"))[0]
    assert sample.text == "done" and sample.finish_reason == "stop"
    assert sample.token_ids[-1] in tiny.eos_ids and len(sample.token_ids) == 5
    assert sample.logprobs == (0.0,) * 5  # the processor left one token possible at each step
    (cut,) = tiny.sample(["x"], 1, max_new_tokens=20, logits_processor=ForceText(tiny, "ab STOP cd"), stop=("STOP",))[0]
    assert cut.text == "ab " and cut.finish_reason == "stop"
    assert tiny.decode(cut.token_ids) == "ab STOP"
    (long,) = tiny.sample(["x"], 1, max_new_tokens=3, logits_processor=ForceText(tiny, "abcdef"))[0]
    assert long.text == "abc" and long.finish_reason == "length"


# --- training ----------------------------------------------------------------------------------------------------


def _train(policy: ConductorLM, prompt: list[int], target: list[int], steps: int = 1) -> None:
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    policy.train()
    for _ in range(steps):
        loss = -policy.sequence_logprobs(prompt, target, grad=True).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    policy.eval()


def test_a_lora_step_changes_only_lora_weights_and_raises_the_target_logprob(tiny: ConductorLM) -> None:
    prompt, target = tiny.encode(PROMPTS[1]), tiny.tokenizer("model_id=[0]", add_special_tokens=False)["input_ids"]
    trainable = {n for n, p in tiny.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before_weights = {n: p.detach().clone() for n, p in tiny.model.named_parameters()}
    before = tiny.sequence_logprobs(prompt, target).sum().item()
    _train(tiny, prompt, target)
    after = tiny.sequence_logprobs(prompt, target).sum().item()
    assert after > before + 0.1
    changed = {n for n, p in tiny.model.named_parameters() if not torch.equal(p, before_weights[n])}
    assert changed and changed <= trainable
    assert any("lora_B" in n for n in changed)


def test_lora_weights_stay_float32_on_a_bfloat16_base() -> None:
    policy = ConductorLM.tiny(dtype="bfloat16")
    assert policy.dtype == torch.bfloat16
    dtypes = {n: p.dtype for n, p in policy.model.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if "lora_" in n)
    assert all(d == torch.bfloat16 for n, d in dtypes.items() if "lora_" not in n)
    (sample,) = policy.sample(["hi"], 1, max_new_tokens=4, seed=0)[0]
    assert len(sample.token_ids) == 4
    _train(policy, policy.encode("hi"), list(sample.token_ids))


def test_lora_targets_default_to_every_projection() -> None:
    policy = ConductorLM.tiny(lora=LoraSpec(r=2, alpha=4, target_modules=("q_proj", "v_proj")))
    names = {n.split(".")[-4] for n, _ in policy.model.named_parameters() if "lora_A" in n}
    assert names == {"q_proj", "v_proj"}
    assert ConductorLM.tiny().lora.target_modules == (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    )  # fmt: skip


# --- save, load, merge --------------------------------------------------------------------------------------------


def _greedy(policy: ConductorLM) -> list[tuple[int, ...]]:
    return [s.token_ids for s in _flat(policy.sample(PROMPTS, 1, max_new_tokens=10, temperature=0))]


def test_save_then_load_gives_identical_greedy_output(tiny: ConductorLM, tmp_path: Path) -> None:
    _train(tiny, tiny.encode(PROMPTS[0]), tiny.tokenizer("42", add_special_tokens=False)["input_ids"], steps=3)
    expected = _greedy(tiny)
    saved = tiny.save(tmp_path / "ckpt")
    assert saved == (tmp_path / "ckpt").absolute() == tiny.saved_to
    names = {p.name for p in saved.iterdir()}
    assert {CONFIG_NAME, "adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "base"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    loaded = ConductorLM.load(saved)
    assert _greedy(loaded) == expected
    assert loaded.lora == tiny.lora and loaded.name == "tiny" and loaded.saved_to == saved
    assert all(p.requires_grad for n, p in loaded.model.named_parameters() if "lora_" in n)  # training can go on
    # saving again over a checkpoint replaces it
    _train(loaded, tiny.encode(PROMPTS[1]), tiny.tokenizer("7", add_special_tokens=False)["input_ids"], steps=3)
    loaded.save(saved)
    assert _greedy(ConductorLM.load(saved)) == _greedy(loaded)


def test_full_weights_without_lora_round_trip(tmp_path: Path) -> None:
    policy = ConductorLM.tiny(lora=None)
    assert policy.lora is None and len(policy.trainable_parameters()) == len(list(policy.model.parameters()))
    _train(policy, policy.encode("a"), policy.encode("b"))
    loaded = ConductorLM.load(policy.save(tmp_path / "full"))
    assert loaded.lora is None and _greedy(loaded) == _greedy(policy)


def test_a_missing_adapter_file_is_named(tiny: ConductorLM, tmp_path: Path) -> None:
    saved = tiny.save(tmp_path / "ckpt")
    (saved / "adapter_model.safetensors").unlink()
    with pytest.raises(ConductorError, match=r"adapter file .*adapter_model\.safetensors is missing"):
        ConductorLM.load(saved)
    (saved / CONFIG_NAME).unlink()
    with pytest.raises(ConductorError, match=CONFIG_NAME):
        ConductorLM.load(saved)


def test_save_refuses_to_overwrite_a_folder_that_is_not_a_checkpoint(tiny: ConductorLM, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("keep me")
    with pytest.raises(ConductorError, match="refusing to overwrite"):
        tiny.save(tmp_path)
    assert (tmp_path / "data.txt").read_text() == "keep me"


def test_merge_adapter_returns_a_plain_model_with_the_same_outputs(tiny: ConductorLM) -> None:
    from peft import PeftModel

    _train(tiny, tiny.encode("a"), tiny.encode("bcd"), steps=3)
    merged = tiny.merge_adapter()
    assert not isinstance(merged, PeftModel) and isinstance(tiny.model, PeftModel)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    ids = torch.tensor([tiny.encode(PROMPTS[1])])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, tiny.model(ids).logits, atol=1e-5)


def test_a_transformers_folder_is_a_base_that_checkpoints_refer_to(tiny: ConductorLM, tmp_path: Path) -> None:
    tiny.base_model().save_pretrained(tmp_path / "base-model")
    tiny.tokenizer.save_pretrained(tmp_path / "base-model")
    policy = ConductorLM.from_pretrained(tmp_path / "base-model", lora=LoraSpec(r=2, alpha=4), device="cpu")
    assert policy.base == str((tmp_path / "base-model").resolve()) and policy.name == "base-model"
    _train(policy, policy.encode("a"), policy.encode("xyz"), steps=2)
    saved = policy.save(tmp_path / "ckpt")
    assert not (saved / "base").exists()  # the base is referred to, not copied
    assert _greedy(ConductorLM.load(saved)) == _greedy(policy)
