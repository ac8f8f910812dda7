"""``LocalEngine``: the one DSPy custom engine for local models, frozen workers and the trainable policy alike.

A frozen model is named (an embedded model, a transformers folder or a GGUF) and loads lazily, on the first call,
from the process-wide cache; a trainable policy (``ConductorLM``) is passed in. Both encode the request with the one
chat encoding and generate with ``LocalModel.sample``, so what the conductor writes under DSPy is what GRPO trained.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
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

from conductor._imports import import_object
from conductor.errors import ConductorError
from conductor.local._encoding import request_messages
from conductor.local._model import LocalModel
from conductor.local._registry import (
    DEFAULT_MODEL,
    check_available,
    dtype_name,
    frozen_model,
    model_label,
    model_source,
)
from conductor.local._sample import LogitsProcessorLike, Sample
from conductor.modules import Messages, chat_request

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256


class LocalEngine:
    """A DSPy custom engine (``complete(Request) -> Response``) over a ``LocalModel``.

    Args:
        model: an embedded model name, a transformers folder or a ``.gguf`` file (a frozen model, loaded on the first
            call and shared with every engine over it), or a ``LocalModel`` such as a ``ConductorLM``.
        dtype, num_threads: how a named model loads (see ``frozen_model``).
        temperature, max_tokens: used when a request leaves them unset (``0`` is greedy); a request's ``seed``,
            ``top_p``, ``top_k`` and ``stop`` are honoured.
        logits_processor: constrains every generation (e.g. to the workflow grammar).
        on_sample: receives each ``Sample`` (prompt and completion ids, log-probs), so an RL loop can run a DSPy
            program and still get the exact tokens it trains on.

    A prompt that alone fills the context window is refused with ``ContextLengthError``; otherwise ``max_tokens``
    shrinks to fit, and a completion cut there finishes with ``"length"``. Calls are thread-safe.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | LocalModel = DEFAULT_MODEL,
        *,
        dtype: str = "float32",
        num_threads: int | None = None,
        temperature: float = 0.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
        on_sample: Callable[[Sample], None] | None = None,
    ):
        if isinstance(model, LocalModel):
            self._model: LocalModel | None = model
            self.source = None
            self.name = f"{'conductor' if model.trainable else 'local'}/{model.name}"
        else:
            self._model = None
            self.source = model_source(model)
            check_available(self.source)
            self.name = f"local/{model_label(self.source)}"
        self.dtype = dtype_name(dtype)
        self.num_threads = num_threads
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.logits_processor = logits_processor
        self.on_sample = on_sample

    @property
    def model(self) -> LocalModel:
        """The model this engine runs; a named one is loaded (once per process) on first use."""
        if self._model is None:
            self._model = frozen_model(self.source, self.dtype, self.num_threads)
        return self._model

    @property
    def context_window(self) -> int | None:
        """The most tokens a prompt and its completion may fill together (loads a named model)."""
        return self.model.context_window

    @property
    def policy(self) -> LocalModel | None:
        """The trainable model this engine runs, if it was given one (never loads anything)."""
        return self._model if self._model is not None and self._model.trainable else None

    def complete(self, request: Request) -> Response:
        model = self.model
        config = request.config
        prompt = model.encode(request_messages(request))
        max_new = config.max_tokens or self.max_tokens
        window = model.context_window
        if window is not None:
            if len(prompt) >= window:
                raise ContextLengthError(
                    f"{self.name}: {len(prompt)} prompt tokens fill the context window of {window} tokens"
                )
            max_new = min(max_new, window - len(prompt))  # a shorter answer, marked "length", beats an error
        (sample,) = model.sample(
            [prompt],
            max_new_tokens=max_new,
            temperature=self.temperature if config.temperature is None else config.temperature,
            top_p=1.0 if config.top_p is None else config.top_p,
            top_k=config.top_k or 0,
            seed=config.seed,
            logits_processor=self.logits_processor,
            stop=tuple(config.stop),
        )[0]
        if self.on_sample is not None:
            self.on_sample(sample)
        output_tokens = len(sample.token_ids)
        return Response(
            id=None,
            model=self.name,
            message=Message.assistant([TextPart(sample.text.strip())]),
            finish_reason=sample.finish_reason,
            usage=Usage(
                input_tokens=len(prompt), output_tokens=output_tokens, total_tokens=len(prompt) + output_tokens
            ),
        )

    def stream(
        self, request: Request
    ) -> Iterator[StreamStartEvent | StreamDeltaEvent | StreamEndEvent | StreamErrorEvent]:
        """The whole completion as one stream (the models are small enough that token streaming isn't worth it)."""
        return response_to_events(self.complete(request))

    def count_tokens(self, messages: Messages) -> int:
        """Exact prompt tokens of OpenAI-style ``messages``: the request ``LMWorker.complete`` sends, encoded as
        ``complete`` encodes it."""
        return len(self.model.encode(request_messages(chat_request(self.name, messages))))

    def close(self) -> None:
        """Nothing to release: frozen weights stay in the process-wide cache, and a policy belongs to the caller."""

    def dump_state(self) -> dict[str, Any]:
        """A named model by its name; a given model by the folder it was last saved to (``saved_to``), so save a
        policy before saving a DSPy program that uses it. ``logits_processor`` and ``on_sample`` are left out."""
        if self.logits_processor is not None or self.on_sample is not None:
            logger.warning("LocalEngine state leaves out logits_processor and on_sample; set them after loading")
        state = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.source is not None:
            return {"model": self.source, "dtype": self.dtype, "num_threads": self.num_threads, **state}
        saved_to = getattr(self._model, "saved_to", None)
        if saved_to is None:
            raise ConductorError(
                f"{self.name} was never saved: call policy.save(folder) before saving a program that uses it"
            )
        model_class = type(self._model)
        return {"model_class": f"{model_class.__module__}:{model_class.__qualname__}", "path": str(saved_to), **state}

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> LocalEngine:
        state = dict(state)
        if "path" in state:  # a saved policy, reloaded by its own class
            model_class = import_object(state.pop("model_class"))
            return cls(model_class.load(state.pop("path")), **state)
        return cls(state.pop("model"), **state)

    def __repr__(self) -> str:
        return f"LocalEngine({self.name!r}, temperature={self.temperature}, max_tokens={self.max_tokens})"


def local_lm(
    model: str | os.PathLike[str] | LocalModel = DEFAULT_MODEL,
    *,
    dtype: str = "float32",
    num_threads: int | None = None,
    logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    **lm_kwargs: Any,
) -> dspy.LM:
    """A ``dspy.LM`` over a ``LocalEngine`` (``local/<name>``, or ``conductor/<name>`` for a trainable policy); no
    DSPy response cache and no retries by default. ``temperature`` and ``max_tokens`` among ``lm_kwargs`` are also
    the engine's defaults."""
    defaults = {k: lm_kwargs[k] for k in ("temperature", "max_tokens") if lm_kwargs.get(k) is not None}
    engine = LocalEngine(
        model, dtype=dtype, num_threads=num_threads, logits_processor=logits_processor, on_sample=on_sample, **defaults
    )
    return dspy.LM(engine.name, engine=engine, **{"cache": False, "num_retries": 0, **lm_kwargs})


def trainable_policy(lm: Any) -> Any:
    """The trainable policy (e.g. a ``ConductorLM``) behind a ``dspy.LM``, or ``None`` (an API model, a frozen local
    model, a scripted LM). Needs no torch."""
    engine = getattr(lm, "engine", None)
    return engine.policy if isinstance(engine, LocalEngine) else None
