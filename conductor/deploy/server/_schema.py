"""The OpenAI wire format as the server reads and writes it: the chat request, the error object, the
``chat.completion`` (or its ``chat.completion.chunk`` events) with ``usage`` and the extra ``conductor`` field.

Plain data, no web framework: the routes (``_chat.py``, ``_app.py``) turn these into HTTP responses.
"""

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Annotated, Any

import dspy
import pydantic
from typing_extensions import TypedDict  # pydantic's own dependency; it needs this TypedDict before Python 3.12

from conductor.modules import Budget, RunResult

logger = logging.getLogger(__name__)

MOST_TOKENS = 10**12
MOST_COST = 10**6
MOST_STEPS = 10**6
"""The most a request may ask for (tokens, dollars, steps), far beyond any run. Bounds keep a client's numbers within
what the spend ledger stores (SQLite integers below 2**63, dollars as nanodollars) and what ``Budget`` can compare;
JSON numbers of more than 4,300 digits never get here (Python's int-from-str limit: they are invalid JSON)."""


class RequestError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI error object (``extra``: more top-level fields)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.kind, self.param = status, message, code, kind, param
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error, **self.extra}


def _within(low: int, high: int) -> pydantic.AfterValidator:
    """A check that a number lies from ``low`` to ``high``, whose error names the whole range."""

    def check(value: float) -> float:
        if not low <= value <= high:
            raise ValueError(f"must be from {low:,} to {high:,}")
        return value

    return pydantic.AfterValidator(check)


class BudgetRequest(TypedDict, total=False):
    """``conductor_budget``: the ``Budget`` limits a request lowers, each in its range; any other field is kept for
    ``_budget`` to refuse by name."""

    __pydantic_config__ = pydantic.ConfigDict(extra="allow")  # type: ignore[misc]
    max_steps: Annotated[int, _within(0, MOST_STEPS)] | None
    max_tokens: Annotated[int, _within(0, MOST_TOKENS)] | None
    max_cost: Annotated[float, _within(0, MOST_COST)] | None
    max_tokens_per_step: Annotated[int, _within(0, MOST_TOKENS)] | None


class Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(pydantic.BaseModel):
    """The fields the server reads (see ``conductor.deploy.server``'s docstring); the rest of an OpenAI request is
    kept for the audit log and otherwise ignored."""

    model_config = pydantic.ConfigDict(extra="allow", allow_inf_nan=False)
    messages: list[Message] = pydantic.Field(min_length=1)
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    max_tokens: Annotated[int, _within(1, MOST_TOKENS)] | None = None
    max_completion_tokens: Annotated[int, _within(1, MOST_TOKENS)] | None = None
    temperature: float | None = pydantic.Field(None, ge=0, le=2)
    response_format: dict[str, Any] | None = None
    conductor_budget: BudgetRequest | None = None


@dataclasses.dataclass(frozen=True)
class Completion:
    """One answer as OpenAI's ``chat.completion``, or as the ``chat.completion.chunk`` events of a stream."""

    id: str
    created: int
    model: str

    def message(self, content: str, finish: str, usage: dict[str, int], trace: dict[str, Any]) -> dict[str, Any]:
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
        return self._object("chat.completion", [choice], usage=usage, conductor=trace)

    def chunks(
        self, content: str, finish: str, usage: dict[str, int], trace: dict[str, Any], include_usage: bool
    ) -> str:
        """The server-sent events of the whole answer: the role, the content, the end (with the ``conductor``
        field), the usage if asked, then ``[DONE]``."""
        deltas = [({"role": "assistant", "content": ""}, None), ({"content": content}, None), ({}, finish)]
        chunks = [
            self._chunk([{"index": 0, "delta": delta, "finish_reason": end}], include_usage) for delta, end in deltas
        ]
        chunks[-1]["conductor"] = trace
        if include_usage:
            chunks.append(self._object("chat.completion.chunk", [], usage=usage))
        events = [f"data: {json.dumps(chunk, allow_nan=False, separators=(',', ':'))}\n\n" for chunk in chunks]
        return "".join(events) + "data: [DONE]\n\n"

    def _chunk(self, choices: list[dict[str, Any]], include_usage: bool) -> dict[str, Any]:
        # With include_usage, OpenAI sends "usage": null on every chunk before the last.
        return self._object("chat.completion.chunk", choices, **({"usage": None} if include_usage else {}))

    def _object(self, kind: str, choices: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **fields,
        }


def run_result(prediction: dspy.Prediction) -> RunResult:
    """The run behind ``prediction``, for its token and cost totals (the conductor's own included) and splits."""
    return RunResult(
        prediction.response, prediction.trace, prediction.error, prediction.workflow, prediction.conductor_usage
    )


def usage(result: RunResult) -> dict[str, int]:
    """OpenAI's ``usage``: every step's tokens and the conductor LM's own."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.tokens,
    }


def conductor_field(prediction: dspy.Prediction, result: RunResult, budget: Budget, elapsed_s: float) -> dict[str, Any]:
    """The response's ``conductor`` field: what the run did, cost and used of its budget."""
    return {
        "workflow": prediction.workflow.to_text() if prediction.workflow is not None else None,
        "response": prediction.response,
        "steps": [_fields(step) for step in result.steps],
        "tokens": result.tokens,
        "cost": result.cost,
        "cost_by_step": result.cost_by_step(),
        "cost_by_worker": result.cost_by_worker(),
        "conductor_usage": _fields(result.conductor_usage),
        "latency_s": elapsed_s,
        "budget": _fields(budget),
        "error": _fields(result.error) if result.error is not None else None,
    }


def _fields(record: Any) -> dict[str, Any]:
    """A dataclass's fields, one level deep (``dataclasses.asdict`` deep-copies every value, a cost per request)."""
    return {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}


@contextlib.contextmanager
def storage(doing: str) -> Iterator[None]:
    """A store's work (``doing``: "write the spend ledger"), whose failure becomes a 503 the client may retry,
    logged in one line (a refusal, such as a 429, passes)."""
    try:
        yield
    except RequestError:
        raise
    except Exception as exc:
        logger.error("can't %s: %s: %s", doing, type(exc).__name__, exc)
        raise RequestError(
            503, f"the server can't {doing} now; try again later", "storage_unavailable", "server_error"
        ) from exc
