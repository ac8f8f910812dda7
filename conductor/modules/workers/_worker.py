"""The one interface every worker kind implements, and the LM-backed worker.

Everything that can take a step of a workflow is a ``Worker``: an API model named by a litellm string, a local model
served in-process, or a Python tool. The executor only ever talks to this interface, and awaits each call: an API
model's on the event loop (litellm's async client), a blocking one on a daemon thread.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import functools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.lm15 import Config, Message, Request, Response
from dspy.utils.exceptions import LMAuthError, LMBillingError, LMConfigurationError, LMInvalidRequestError
from dspy.utils.usage_tracker import UsageTracker, track_usage

from conductor.errors import ConfigError, WorkerError
from conductor.modules import _threads
from conductor.modules.workers._limits import CallLimits
from conductor.modules.workflow import WorkerPromptAdapter

logger = logging.getLogger(__name__)

# Failures a retry can't fix: a bad request (context window included), bad credentials, no credit, bad settings.
_PERMANENT_LM_ERRORS = (LMInvalidRequestError, LMAuthError, LMBillingError, LMConfigurationError)

Messages = list[dict[str, str]]
"""OpenAI-style chat messages: ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``."""


@dataclass(frozen=True)
class Price:
    """Dollars per 1,000 input and output tokens (finite, not negative)."""

    input_per_1k: float = 0.0
    output_per_1k: float = 0.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(p) and p >= 0 for p in (self.input_per_1k, self.output_per_1k)):
            raise ConfigError(f"prices must be finite and not negative, not {self!r}")

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_1k + output_tokens * self.output_per_1k) / 1000


FREE = Price()
"""The price of tools and in-process models: they cost no money."""


@functools.cache  # the local cost map doesn't change in a process; the conductor asks for its price on every call
def litellm_price(model: str) -> Price | None:
    """The price litellm's cost map lists for the litellm model string ``model`` (the package's local copy of the map),
    or ``None`` when it lists none. Models with tiered prices are priced at their first tier."""
    import litellm

    if model not in litellm.model_cost and model.partition("/")[0] not in litellm.provider_list:
        return None  # no provider litellm knows: asking would only print litellm's provider banner to stdout
    try:
        info = litellm.get_model_info(model)
    except Exception:  # litellm raises plain Exceptions for models it has not mapped
        return None
    per_token = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if None in per_token:
        return None
    return Price(per_token[0] * 1000, per_token[1] * 1000)


def prompt_tokens(lm: dspy.LM, messages: Messages) -> int:
    """Prompt tokens of ``messages`` for ``lm``: exact from an in-process engine that counts (a local model), else
    litellm's count for the model, else a cautious estimate of 1 token per 3 characters."""
    count = getattr(lm.engine, "count_tokens", None)
    if callable(count):
        return count(messages)
    try:
        import litellm

        return int(litellm.token_counter(model=lm.model, messages=messages))
    except Exception:  # unknown model name: fall back to the cautious estimate
        return sum(math.ceil(len(m["content"]) / 3) + 4 for m in messages)


def context_window(lm: dspy.LM) -> int | None:
    """The most prompt tokens ``lm`` takes, when known without calling it: an in-process engine's window (a local
    model's), else litellm's ``max_input_tokens`` for the model; ``None`` when unknown."""
    engine = getattr(lm, "engine", None)
    if not isinstance(engine, str):  # a custom engine: only it can know
        return getattr(engine, "context_window", None)
    return _litellm_window(lm.model)


@functools.cache
def _litellm_window(model: str) -> int | None:
    import litellm

    try:
        window = litellm.get_model_info(model).get("max_input_tokens")
    except Exception:  # litellm raises a bare Exception for a model its map doesn't list
        return None
    return int(window) if window else None


def lm_price(lm: dspy.LM) -> Price | None:
    """The price of ``lm``'s tokens: free for a model behind a custom DSPy engine (it runs in-process: a local or the
    trained conductor model), else litellm's price for its model, or ``None`` when that is unknown."""
    if not isinstance(lm.engine, str):  # "auto", "litellm", "lm15": a provider's API
        return FREE
    return litellm_price(lm.model)


@dataclass(frozen=True)
class Completion:
    """What a worker returns for one call. ``cost`` is ``None`` when the worker can't price the call itself;
    the executor then prices it from the worker's ``price``. Counts and cost can't be negative (or the cost NaN):
    such a completion is a worker's bug, raised as a ``WorkerError`` that is not retried."""

    text: str
    input_tokens: int
    output_tokens: int
    cost: float | None = None

    def __post_init__(self) -> None:
        usage_ok = self.input_tokens >= 0 and self.output_tokens >= 0
        if not usage_ok or (self.cost is not None and not (math.isfinite(self.cost) and self.cost >= 0)):
            raise WorkerError(
                f"a completion reported impossible usage: {self.input_tokens} input and {self.output_tokens} output "
                f"tokens, cost {self.cost}",
                retryable=False,
            )


class Worker(abc.ABC):
    """A member of a worker pool: chat messages in, text out, with token counts.

    Contract every implementation keeps (checked by ``tests/modules/worker_contract.py``):

    - ``complete`` is thread-safe: the executor may call one worker from several threads at once (each blocking call
      runs on a daemon thread of its own). ``acomplete_step``, what the executor awaits, keeps the same contract.
    - ``complete`` honours ``max_tokens`` as an upper bound on ``Completion.output_tokens`` (the executor relies on it
      to keep a run inside its budget) and returns non-negative token counts.
    - Failures raise ``WorkerError`` (or a subclass); anything else escaping ``complete`` is treated the same way.
    - ``count_tokens`` may over-estimate but should not under-estimate the prompt tokens of ``messages``: the
      executor reserves budget for the prompt it counts, and a call that reports more than its step reserved (prompt
      plus ``max_tokens``, and their cost) stops the run with a budget error.
    - A worker never retries on its own: retries, backoff, timeouts and its ``limits`` (``max_concurrency``,
      ``requests_per_minute``: the executor waits for a turn before each call) belong to the executor.
    - ``price`` is what its tokens cost, ``None`` when unknown. Tools and in-process models are free by construction
      (the default, ``FREE``); an ``LMWorker`` over an API model is priced from litellm's cost map unless given a
      price. A worker of unknown price can't run under a cost budget (the run ends with a budget error naming it).
    - ``framing`` is how the executor words its steps (``WorkerPromptAdapter``): ``"task"`` (the default) gives every
      step the role's instructions, the overall task and the subtask; ``"plain"`` sends a step that answers the whole
      question on its own the question alone, as a user would call the model (other steps keep the task framing).
    """

    def __init__(
        self,
        name: str,
        *,
        description: str = "",
        price: Price | None = FREE,
        max_tokens: int = 512,
        temperature: float = 0.2,
        timeout_s: float = 120.0,
        retries: int = 2,
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        framing: str = "task",
    ):
        if not name:
            raise ValueError("a worker needs a name")
        self.name = name
        self.description = description
        self.price = price
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.retries = retries
        self.limits = CallLimits(max_concurrency, requests_per_minute)
        """How many of its calls may be in flight and how often one may start, across every run that calls it."""
        self.framing = _checked_framing(name, framing)

    @abc.abstractmethod
    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        """Answer the last user message of ``messages``."""

    def complete_step(
        self, inputs: dict[str, str], messages: Messages, *, max_tokens: int, temperature: float
    ) -> Completion:
        """Take a workflow step: ``inputs`` are its role's input fields (``question``, ``context``, ``subtask``) and
        ``messages`` the prompt made of them. The executor calls this; the default answers ``messages`` with
        ``complete``. Workers that need the fields rather than the prompt (DSPy modules, tools that take the subtask)
        override it."""
        return self.complete(messages, max_tokens=max_tokens, temperature=temperature)

    async def acomplete_step(
        self, inputs: dict[str, str], messages: Messages, *, max_tokens: int, temperature: float
    ) -> Completion:
        """``complete_step`` for the executor's event loop. The default runs it on a daemon thread, which a hung call
        keeps while the loop goes on; a worker that can await its call (an API model) overrides this."""
        return await _threads.on_thread(
            lambda: self.complete_step(inputs, messages, max_tokens=max_tokens, temperature=temperature)
        )

    def count_tokens(self, messages: Messages) -> int:
        """Prompt tokens of ``messages``; the default is a cautious estimate of 1 token per 3 characters."""
        return sum(math.ceil(len(m["content"]) / 3) + 4 for m in messages)

    def with_framing(self, framing: str) -> Worker:
        """A copy of this worker whose steps are worded in ``framing``. It shares the rest (its model or tool, its
        limits, a ``ReplayWorker``'s answers); counts kept as plain numbers (a ``ReplayWorker``'s ``calls``) go on
        separately in the copy."""
        clone = copy.copy(self)
        clone.framing = _checked_framing(self.name, framing)
        return clone

    def close(self) -> None:  # noqa: B027 - optional hook, most workers hold nothing
        """Release what the worker holds (processes, models). Safe to call twice."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _checked_framing(name: str, framing: str) -> str:
    if framing not in WorkerPromptAdapter.FRAMINGS:
        raise ConfigError(f"worker {name!r}: framing must be one of {WorkerPromptAdapter.FRAMINGS}, not {framing!r}")
    return framing


def chat_request(model: str, messages: Messages, **config: Any) -> Request:
    """The DSPy request for OpenAI-style ``messages``: system messages joined into the system prompt, the rest as
    user and assistant turns. Every worker that talks to a ``dspy.LM`` (and counts its tokens) goes through this."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or None
    turns = tuple(
        Message.user(m["content"]) if m["role"] == "user" else Message.assistant(m["content"])
        for m in messages
        if m["role"] != "system"
    )
    return Request(model=model, messages=turns, system=system, config=Config(**config))


class LMWorker(Worker):
    """A worker backed by a ``dspy.LM``: any litellm model string, or an in-process model behind a DSPy engine.

    Local and API models share this one code path; only the ``dspy.LM`` they wrap differs. Without a ``price``, an
    in-process model is free and an API model is priced from litellm's cost map (see ``lm_price``); one litellm
    doesn't know has an unknown price (``None``): it counts as $0 only in runs without a cost budget.
    """

    def __init__(
        self,
        name: str,
        lm: dspy.LM,
        *,
        price: Price | None = None,
        **kwargs: Any,
    ):
        if price is None:
            price = lm_price(lm)
            if price is None:
                logger.warning(
                    "worker %r: litellm's cost map has no price for %r; give the worker a price, or it counts as $0 "
                    "and can't run under a cost budget",
                    name,
                    lm.model,
                )
        super().__init__(name, price=price, **kwargs)
        self.lm = lm

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        request = chat_request(self.lm.model, messages, max_tokens=max_tokens, temperature=temperature)
        with self._calling() as billed:
            response = self.lm(request)
        return self._completion(response, messages, billed)

    async def acomplete_step(
        self, inputs: dict[str, str], messages: Messages, *, max_tokens: int, temperature: float
    ) -> Completion:
        """An API model's call is awaited on the event loop (``dspy.LM.acall``); an in-process model's blocks, so it
        runs on a daemon thread."""
        if not isinstance(self.lm.engine, str):  # a custom engine: an in-process model
            return await super().acomplete_step(inputs, messages, max_tokens=max_tokens, temperature=temperature)
        request = chat_request(self.lm.model, messages, max_tokens=max_tokens, temperature=temperature)
        with self._calling() as billed:
            response = await self.lm.acall(request)
        return self._completion(response, messages, billed)

    @contextlib.contextmanager
    def _calling(self) -> Iterator[UsageTracker | None]:
        """Around one call of the LM: its failures as ``WorkerError``s, and DSPy's usage tracker when a call can go
        unbilled. Only with DSPy's cache on (``cache: true``, an opt-in for training) can it: a cache hit records no
        usage, so the tracker is kept just then, off the hot path of every other call."""
        tracking = track_usage() if self.lm.cache else contextlib.nullcontext()
        try:
            with tracking as billed:
                yield billed
        except Exception as exc:
            retryable = not isinstance(exc, _PERMANENT_LM_ERRORS)
            raise WorkerError(f"{self.name}: {type(exc).__name__}: {exc}", retryable=retryable) from exc

    def _completion(self, response: Response, messages: Messages, billed: UsageTracker | None) -> Completion:
        """The ``Completion`` of the LM's ``response`` to ``messages``."""
        usage = response.usage
        input_tokens = (usage.input_tokens if usage else None) or self.count_tokens(messages)
        output_tokens = (usage.output_tokens if usage else None) or 0
        cached = billed is not None and not billed.usage_data  # DSPy's cache answered: the provider billed nothing
        return Completion(response.text or "", input_tokens, output_tokens, cost=0.0 if cached else None)

    def count_tokens(self, messages: Messages) -> int:
        return prompt_tokens(self.lm, messages)
