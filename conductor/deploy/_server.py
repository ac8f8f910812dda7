"""One program as one model behind an OpenAI-compatible HTTP API: ``POST /v1/chat/completions``, ``GET /v1/models``
and ``GET /health``.

A thin layer over the library: the question (the last user message) goes to the ``Conductor`` module, and its
prediction comes back as a ``chat.completion`` whose extra ``conductor`` field holds the workflow, the per-step
trace, tokens, cost and the run's error, if any. The program is synchronous, so it runs in a bounded thread pool.
Streaming is not supported yet: ``stream: true`` is refused with a 400.

Needs FastAPI (``pip install 'dspy-conductor[serve]'``), imported only when an app is made.
"""

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import importlib
import json
import logging
import time
import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Any

import dspy
import pydantic

from conductor.errors import MissingDependency
from conductor.modules import Budget, Conductor

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_CONCURRENCY = 16
_BUDGET_FIELDS = tuple(f.name for f in dataclasses.fields(Budget))


def import_serving(name: str) -> ModuleType:
    """Import an optional serving dependency (fastapi, uvicorn), or say how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingDependency(f"serving a program needs {name}: pip install 'dspy-conductor[serve]'") from exc


class RequestError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI-style error object."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


class _Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class _ChatRequest(pydantic.BaseModel):
    """The fields the server reads; the rest of an OpenAI request (temperature, ...) is accepted and ignored."""

    model_config = pydantic.ConfigDict(extra="allow")
    messages: list[_Message] = pydantic.Field(min_length=1)
    model: str | None = None
    stream: bool = False
    conductor_budget: dict[str, Any] | None = None


def create_app(
    program: Conductor,
    *,
    model: str = "dspy-conductor",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
    budget: Budget | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> "FastAPI":
    """A FastAPI app serving ``program`` as the model ``model``.

    Args:
        max_request_bytes: larger request bodies get a 413.
        request_timeout_s: a request not answered in time (waiting for a thread included) gets a 504; its run can't
            be stopped and finishes in the background.
        budget: the most a request's run may use (default: the program's own budget); a request may lower it
            with a ``conductor_budget`` object (fields of ``Budget``) but never raise it.
        concurrency: how many runs at once; more requests wait for a thread.
    """
    fastapi = import_serving("fastapi")
    from fastapi.responses import JSONResponse

    ceiling = budget or program.executor.budget
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="conductor-run")

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        threads.shutdown(wait=False, cancel_futures=True)

    app = fastapi.FastAPI(title=f"dspy-conductor: {model}", lifespan=lifespan)

    def refuse(error: RequestError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: fastapi.Request) -> JSONResponse:
        try:
            chat = _parse(await _read_body(request, max_request_bytes))
            inputs = _inputs(program.signature, _question(chat.messages))
            run_budget = _lowered(ceiling, chat.conductor_budget)
        except RequestError as exc:
            return refuse(exc)
        started = time.perf_counter()
        future = threads.submit(_with_budget(program, run_budget), **inputs)
        try:
            prediction = await asyncio.wait_for(asyncio.wrap_future(future), request_timeout_s)
        except TimeoutError:
            return refuse(RequestError(504, f"no answer within {request_timeout_s:g} s", "timeout", "timeout_error"))
        except Exception as exc:
            logger.exception("the program failed")
            return refuse(RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error"))
        if prediction.error is not None and prediction.error.kind == "input":
            return refuse(RequestError(400, prediction.error.message, "invalid_input"))
        return JSONResponse(_completion(program, prediction, model, run_budget, time.perf_counter() - started))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "dspy-conductor"}],
        }

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model, "workers": program.pool.names}

    return app


async def _read_body(request: Any, limit: int) -> bytes:
    too_large = RequestError(413, f"the request body is larger than {limit:,} bytes", "request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _parse(body: bytes) -> _ChatRequest:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object", "invalid_request")
    try:
        chat = _ChatRequest.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(body)'}: {e['msg']}" for e in exc.errors())
        raise RequestError(400, f"invalid request: {problems}", "invalid_request") from None
    if chat.stream:
        raise RequestError(400, "streaming is not supported yet: send `stream: false`", "stream_unsupported")
    return chat


def _question(messages: list[_Message]) -> str:
    """The last user message's text (a string, or its text parts joined by newlines)."""
    user = next((m for m in reversed(messages) if m.role == "user"), None)
    if user is None or user.content is None:
        raise RequestError(400, "the messages hold no user message with content", "no_user_message")
    if isinstance(user.content, str):
        return user.content
    if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in user.content):
        raise RequestError(400, "only text content parts are supported", "unsupported_content")
    return "\n".join(part["text"] for part in user.content)


def _inputs(signature: type[dspy.Signature], question: str) -> dict[str, Any]:
    """The program's inputs: the question for a one-input signature, else a JSON object naming every input."""
    names = list(signature.input_fields)
    if len(names) == 1:
        return {names[0]: question}
    try:
        inputs = json.loads(question)
    except json.JSONDecodeError:
        inputs = None
    if not isinstance(inputs, dict) or set(names) - set(inputs):
        raise RequestError(400, f"this program takes {names}: send a JSON object with them", "invalid_input")
    return {name: inputs[name] for name in names}


def _lowered(ceiling: Budget, requested: dict[str, Any] | None) -> Budget:
    """``ceiling`` with each limit the request sets lowered to it; a request can't raise a limit."""
    if not requested:
        return ceiling
    unknown = sorted(set(requested) - set(_BUDGET_FIELDS))
    if unknown:
        raise RequestError(400, f"conductor_budget has unknown fields {unknown}; use {list(_BUDGET_FIELDS)}", "budget")
    try:
        asked = pydantic.TypeAdapter(Budget).validate_python(requested)
    except pydantic.ValidationError as exc:
        raise RequestError(400, f"invalid conductor_budget: {exc.errors()[0]['msg']}", "budget") from None
    lowered = {}
    for name in _BUDGET_FIELDS:
        limit, value = getattr(ceiling, name), getattr(asked, name)
        if value is not None and value < 0:
            raise RequestError(400, f"conductor_budget.{name} must not be negative", "budget")
        lowered[name] = value if limit is None else limit if value is None else min(limit, value)
    return Budget(**lowered)


def _with_budget(program: Conductor, budget: Budget) -> Conductor:
    """``program`` running under ``budget``: a shallow copy sharing predictors, LM and pool, so concurrent requests
    with different budgets never see each other's."""
    if budget == program.executor.budget:
        return program
    run = copy.copy(program)
    run.executor = copy.copy(program.executor)
    run.executor.budget = budget
    return run


def _completion(
    program: Conductor, prediction: dspy.Prediction, model: str, budget: Budget, elapsed_s: float
) -> dict[str, Any]:
    answer = prediction[next(iter(program.signature.output_fields))]
    prompt_tokens = sum(step.prompt_tokens for step in prediction.trace)
    completion_tokens = sum(step.completion_tokens for step in prediction.trace)
    error = prediction.error
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "" if answer is None else str(answer)},
                "finish_reason": "length" if error is not None and error.kind == "budget" else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "conductor": {
            "workflow": prediction.workflow.to_text() if prediction.workflow is not None else None,
            "response": prediction.response,
            "steps": [dataclasses.asdict(step) for step in prediction.trace],
            "tokens": prediction.tokens,
            "cost": prediction.cost,
            "latency_s": elapsed_s,
            "budget": dataclasses.asdict(budget),
            "error": dataclasses.asdict(error) if error is not None else None,
        },
    }
