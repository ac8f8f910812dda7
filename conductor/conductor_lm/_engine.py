"""``ConductorEngine``: a DSPy 3.4 custom engine over a ``ConductorLM``, so the trained policy is a ``dspy.LM``.

Requests are rendered exactly as ``_local.TransformersEngine`` renders them (same prompt helper), and generated with
``ConductorLM.sample``, so what the conductor writes under DSPy is what GRPO trained.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

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

from conductor.conductor_lm._sampling import LogitsProcessorLike, Sample
from conductor.errors import ConductorError

if TYPE_CHECKING:
    from conductor.conductor_lm._model import ConductorLM

logger = logging.getLogger(__name__)

_ROLES = {"user": "user", "assistant": "assistant", "developer": "system", "system": "system"}


def _text(content: Any) -> str:
    """A system prompt or message as text: a string, or the text of its parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content)


def request_messages(request: Request) -> list[dict[str, str]]:
    """OpenAI-style messages of a request: the system prompt first, developer messages as system, tool results
    as user turns."""
    messages = [{"role": "system", "content": _text(request.system)}] if request.system else []
    messages += [{"role": _ROLES.get(m.role, "user"), "content": m.text or ""} for m in request.messages]
    return messages


class ConductorEngine:
    """A DSPy custom engine (``complete(Request) -> Response``) that generates with a ``ConductorLM``.

    ``temperature`` and ``max_tokens`` are used when a request leaves them unset (``0`` is greedy); a request's
    ``seed``, ``top_p`` and ``stop`` are honoured. ``logits_processor`` constrains every generation (e.g. to the
    workflow format); ``on_sample`` receives each ``Sample`` (prompt and completion ids, log-probs), so an RL loop can
    run the ``Conductor`` module through DSPy and still get the exact tokens it trains on.

    ``dump_state`` refers to the folder the policy was last saved to: save the policy before saving a DSPy program
    that uses it (``dspy``'s loader then needs ``allow_unsafe_lm_state=True``, as for any custom engine).
    """

    def __init__(
        self,
        policy: ConductorLM,
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
        on_sample: Callable[[Sample], None] | None = None,
    ):
        self.policy = policy
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.logits_processor = logits_processor
        self.on_sample = on_sample

    def complete(self, request: Request) -> Response:
        config = request.config
        messages = request_messages(request)
        prompt_tokens = len(self.policy.encode(messages))
        max_new = config.max_tokens or self.max_tokens
        window = self.policy.context_window
        if window is not None:
            if prompt_tokens >= window:
                raise ContextLengthError(
                    f"conductor/{self.policy.name}: {prompt_tokens} prompt tokens fill the context window of {window}"
                )
            max_new = min(max_new, window - prompt_tokens)  # a shorter answer, marked "length", beats an error
        temperature = self.temperature if config.temperature is None else config.temperature
        (sample,) = self.policy.sample(
            [messages],
            1,
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=1.0 if config.top_p is None else config.top_p,
            seed=config.seed,
            logits_processor=self.logits_processor,
            stop=tuple(config.stop),
        )[0]
        if self.on_sample is not None:
            self.on_sample(sample)
        output_tokens = len(sample.token_ids)
        return Response(
            id=None,
            model=f"conductor/{self.policy.name}",
            message=Message.assistant([TextPart(sample.text.strip())]),
            finish_reason=sample.finish_reason,
            usage=Usage(
                input_tokens=prompt_tokens, output_tokens=output_tokens, total_tokens=prompt_tokens + output_tokens
            ),
        )

    def stream(
        self, request: Request
    ) -> Iterator[StreamStartEvent | StreamDeltaEvent | StreamEndEvent | StreamErrorEvent]:
        """The whole completion as one stream."""
        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to release: the policy belongs to the caller."""

    def dump_state(self) -> dict[str, Any]:
        if self.policy.saved_to is None:
            raise ConductorError(
                "this ConductorLM was never saved: call policy.save(folder) before saving a program that uses it"
            )
        if self.logits_processor is not None or self.on_sample is not None:
            logger.warning("ConductorEngine state leaves out logits_processor and on_sample; set them after loading")
        return {"path": str(self.policy.saved_to), "temperature": self.temperature, "max_tokens": self.max_tokens}

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> ConductorEngine:
        from conductor.conductor_lm._model import ConductorLM

        policy = ConductorLM.load(state["path"])
        return cls(policy, temperature=state.get("temperature", 0.0), max_tokens=state.get("max_tokens", 512))

    def __repr__(self) -> str:
        return f"ConductorEngine({self.policy.name!r}, temperature={self.temperature}, max_tokens={self.max_tokens})"
