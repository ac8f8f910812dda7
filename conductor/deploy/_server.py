"""One program as one model behind an OpenAI-compatible HTTP API: ``POST /v1/chat/completions``, ``GET /v1/models``
(and ``/v1/models/{id}``) and ``GET /health``, answered as vLLM and LiteLLM's proxy answer, so the official ``openai``
SDK and ``litellm`` work unchanged.

A thin layer over the library: the question (the last user message) goes to the ``Conductor``, which writes a
workflow (``Conductor.ask``); the workflow is checked against the caller's key and run by the program's executor;
the prediction comes back as a ``chat.completion`` whose extra ``conductor`` field holds the workflow, the per-step
trace, tokens, cost (split by step and by worker) and the run's error, if any. ``usage`` counts every step and the
conductor LM's own call. The library's runs are synchronous, so each goes to a bounded thread pool; the event loop
only parses, checks and answers.

The OpenAI request, as read here:

- ``model``: the served model's id, or absent; another id is a 404 (``model_not_found``).
- ``stream: true``: server-sent events (``chat.completion.chunk`` objects, then ``data: [DONE]``); the answer comes
  in one content chunk once the run is over, with the ``conductor`` field on the chunk that ends the choice, and
  ``stream_options: {"include_usage": true}`` adds a last chunk with ``usage``.
- ``max_tokens`` / ``max_completion_tokens``: lower the run's token budget (every step's prompt and completion and the
  conductor's own call), never raising the server's or the key's.
- ``conductor_budget``: any ``Budget`` field, lowering the same way.
- ``n`` other than 1, ``response_format`` other than ``text``, and ``tools`` / ``functions``: refused with a 400, as
  the program writes one free-text answer and calls no client tools.
- ``temperature`` (0 to 2) is accepted and changes nothing: the conductor LM and each worker keep the sampling
  settings the program was compiled with. ``top_p``, ``stop``, ``seed``, ``user``, ``metadata`` and other fields are
  accepted and ignored (and audited).

Every response has an ``x-request-id`` header (the client's, when it sends a usable one; else a new one), and every
run's response an ``x-conductor-cost-usd`` header. Every error, on every route (404 for an unknown route, 405 for a
wrong method, 400 for a request that doesn't parse or validate), is an OpenAI error object ``{"error": {"message",
"type", "param", "code"}}``. A run the budget stopped before any answer is a 400 with code ``budget_exceeded`` (as
OpenAI answers a prompt over the context length: clients raise ``BadRequestError`` and don't retry a request that
would fail again, where a 429 would be retried and a 402 is unknown to them); the error carries the run's
``conductor`` field.

Governance (``_governance.py``, ``_audit.py``): with a ``KeyStore``, every request needs ``Authorization: Bearer
<key>`` (else 401); a workflow that would call a worker the key may not use is refused with a 403 before any worker
runs (the conductor's fallback included), and failover never reaches such a worker; a key's daily limits are held
with a reservation in SQLite before the run (429 when it won't fit). With ``audit_db``, every chat request is
appended to the audit log, redacted: refused ones too, with the reason.

Needs FastAPI (``pip install 'dspy-conductor[serve]'``), imported only when an app is made.
"""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib
import itertools
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import dspy
import pydantic

from conductor.deploy._audit import AuditEntry, AuditLog
from conductor.deploy._governance import (
    KeySpec,
    KeyStore,
    Reservation,
    SpendLedger,
    SpendLimitExceeded,
    worker_problems,
)
from conductor.errors import ConductorError, ConfigError, MissingDependency, validation_problems
from conductor.modules import Budget, Conductor, Executor, RunError, RunResult, WorkerPool, Workflow

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_CONCURRENCY = 16
COST_HEADER = "x-conductor-cost-usd"
_BUDGET_FIELDS = tuple(f.name for f in dataclasses.fields(Budget))
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ID_PREFIX, _ID_COUNTER = uuid.uuid4().hex[:16], itertools.count()


def import_serving(name: str) -> ModuleType:
    """Import an optional serving dependency (fastapi, uvicorn), or say how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingDependency(f"serving a program needs {name}: pip install 'dspy-conductor[serve]'") from exc


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


class _Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class _StreamOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    include_usage: bool = False


class _ChatRequest(pydantic.BaseModel):
    """The fields the server reads (see the module docstring); the rest of an OpenAI request is kept for the audit
    log and otherwise ignored."""

    model_config = pydantic.ConfigDict(extra="allow", allow_inf_nan=False)
    messages: list[_Message] = pydantic.Field(min_length=1)
    model: str | None = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    n: int | None = None
    max_tokens: int | None = pydantic.Field(None, ge=1)
    max_completion_tokens: int | None = pydantic.Field(None, ge=1)
    temperature: float | None = pydantic.Field(None, ge=0, le=2)
    response_format: dict[str, Any] | None = None
    conductor_budget: dict[str, Any] | None = None


def create_app(
    program: Conductor,
    *,
    model: str = "dspy-conductor",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
    budget: Budget | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    keys: KeyStore | None = None,
    audit_db: str | Path | None = None,
    audit_questions: bool = False,
    sensitive_fields: Iterable[str] = (),
) -> "FastAPI":
    """A FastAPI app serving ``program`` as the model ``model``.

    Args:
        max_request_bytes: larger request bodies get a 413.
        request_timeout_s: a request not answered in time (waiting for a thread included) gets a 504; its run can't
            be stopped and finishes in the background.
        budget: the most a request's run may use (default: the program's own budget); a key's budget lowers it, and a
            request may lower it further (``max_tokens``, ``conductor_budget``) but never raise it.
        concurrency: how many runs at once; more requests wait for a thread.
        keys: the API keys allowed in; ``None`` leaves the server open to anyone who can reach it (logged).
        audit_db: the SQLite file of the audit log and of the keys' daily spend (needed when a key has a daily limit).
        audit_questions: keep questions in the audit log (redacted), not only their SHA-256.
        sensitive_fields: request fields never written to the audit log, on top of those named like a secret.
    """
    fastapi = import_serving("fastapi")
    from starlette.exceptions import HTTPException

    ceiling = budget or program.executor.budget
    audit, ledger = _stores(program, keys, audit_db, audit_questions, sensitive_fields)
    runner = _Runner(program, ledger, audit)
    callers = {key.id: _Caller(key, _tighter(ceiling, key.budget), _executor_for(program, key)) for key in keys or ()}
    anyone = _Caller(None, ceiling, program.executor)
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="conductor-run")
    model_card = {"id": model, "object": "model", "created": 0, "owned_by": "dspy-conductor"}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        threads.shutdown(wait=False, cancel_futures=True)

    app = fastapi.FastAPI(title=f"dspy-conductor: {model}", lifespan=lifespan)
    app.add_middleware(_RequestIds)

    def reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> fastapi.Response:
        # ASCII JSON: a lone surrogate a client sent (and an error message quotes) can't be encoded as UTF-8.
        content = json.dumps(body, allow_nan=False, separators=(",", ":"))
        return fastapi.Response(content, status, headers, media_type="application/json")

    def refuse(error: RequestError, headers: dict[str, str] | None = None) -> fastapi.Response:
        if error.status == 401:
            headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
        return reply(error.body(), error.status, headers)

    async def audited_refusal(entry: AuditEntry, error: RequestError) -> fastapi.Response:
        """Refuse a request before its run, recording why in the audit log."""
        if audit is not None:
            entry.outcome, entry.error = _OUTCOMES.get(error.status, "input"), error.message
            await asyncio.get_running_loop().run_in_executor(None, audit.write, entry)
        return refuse(error)

    def caller_of(request: fastapi.Request) -> _Caller:
        """The caller a request's ``Authorization: Bearer <key>`` names; anyone on an open server; else a 401."""
        if keys is None:
            return anyone
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise RequestError(
                401, "an API key is needed: send `Authorization: Bearer <key>`", "missing_api_key", _AUTH
            )
        key = keys.authenticate(token)
        if key is None:
            raise RequestError(401, "the API key is not valid", "invalid_api_key", _AUTH)
        if audit is not None:
            audit.add_secret(token)
        return callers[key.id]

    @app.exception_handler(HTTPException)
    async def routing_error(request: fastapi.Request, exc: HTTPException) -> fastapi.Response:
        """Starlette's 404 (no such route) and 405 (wrong method), as OpenAI errors."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            error = RequestError(404, f"no route {where}: this server answers {_ROUTES}", "not_found")
        elif exc.status_code == 405:
            error = RequestError(405, f"{where} is not allowed; this server answers {_ROUTES}", "method_not_allowed")
        else:
            error = RequestError(exc.status_code, str(exc.detail), "http_error")
        return refuse(error, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def server_error(request: fastapi.Request, exc: Exception) -> fastapi.Response:
        """A bug, as an OpenAI error (Starlette answers it outside the middleware, so the request id is set here)."""
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        error = RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error")
        return refuse(error, {"x-request-id": request.state.request_id})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: fastapi.Request) -> fastapi.Response:
        entry = AuditEntry(request.state.request_id, model, "error")
        try:
            caller = caller_of(request)
            entry.key_id = caller.key.id if caller.key is not None else None
            chat = _parse(await _read_body(request, max_request_bytes))
            entry.request = chat.model_dump(exclude={"messages"}, exclude_unset=True)
            _check_request(chat, model)
            inputs = _inputs(program.signature, question_text(chat.messages))
            run_budget = _request_budget(caller.ceiling, chat)
        except RequestError as exc:
            return await audited_refusal(entry, exc)
        started = time.perf_counter()
        future = threads.submit(runner, caller, inputs, run_budget, entry)
        try:
            prediction = await asyncio.wait_for(asyncio.wrap_future(future), request_timeout_s)
        except TimeoutError:
            return refuse(RequestError(504, f"no answer within {request_timeout_s:g} s", "timeout", "timeout_error"))
        except RequestError as exc:
            return refuse(exc)
        except ConductorError as exc:  # the library's own report, e.g. an unreachable conductor LM
            return refuse(RequestError(502, str(exc), "upstream_error", "server_error"))
        except Exception as exc:
            logger.exception("the program failed")
            return refuse(RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error"))
        result, error = _result(prediction), prediction.error
        trace = _trace(prediction, result, run_budget, time.perf_counter() - started)
        cost = {COST_HEADER: f"{result.cost:.10g}"}
        if error is not None and error.kind == "input":
            return refuse(RequestError(400, error.message, "invalid_input"), cost)
        if error is not None and error.kind == "budget" and prediction.response is None:
            message = f"the budget ran out before an answer: {error.message}"
            return refuse(RequestError(400, message, "budget_exceeded", extra={"conductor": trace}), cost)
        completion = _Completion(f"chatcmpl-{_new_id()}", int(time.time()), model)
        answer = prediction[next(iter(program.signature.output_fields))]
        content = "" if answer is None else str(answer)
        finish = "length" if error is not None and error.kind == "budget" else "stop"
        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage
            events = completion.chunks(content, finish, _usage(result), trace, include_usage)
            headers = {**cost, "cache-control": "no-cache"}
            return fastapi.Response(events, 200, headers, media_type="text/event-stream")
        return reply(completion.message(content, finish, _usage(result), trace), 200, cost)

    @app.get("/v1/models")
    async def models(request: fastapi.Request) -> fastapi.Response:
        try:
            caller_of(request)
        except RequestError as exc:
            return refuse(exc)
        return reply({"object": "list", "data": [model_card]})

    @app.get("/v1/models/{name:path}")
    async def one_model(request: fastapi.Request, name: str) -> fastapi.Response:
        try:
            caller_of(request)
            if name != model:
                raise _unknown_model(name, model)
        except RequestError as exc:
            return refuse(exc)
        return reply(model_card)

    @app.get("/health")
    async def health() -> fastapi.Response:
        return reply({"status": "ok", "model": model, "workers": program.pool.names})

    return app


_AUTH = "authentication_error"
_ROUTES = "POST /v1/chat/completions, GET /v1/models, GET /v1/models/{model} and GET /health"
_OUTCOMES = {401: "unauthorized", 403: "forbidden", 429: "rate-limited"}  # audit outcomes of refusals, by status


class _RequestIds:
    """ASGI middleware: every HTTP response carries ``x-request-id``, the client's (when it is 1-128 characters of
    ``[A-Za-z0-9._:-]``, so it can't inject anything into a header or a log) or a new one; handlers read it from
    ``request.state.request_id``."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = sent if _CLIENT_REQUEST_ID.fullmatch(sent) else f"req-{_new_id()}"
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


@dataclasses.dataclass(frozen=True)
class _Caller:
    """Who asks: their key (``None`` on an open server), the most a run of theirs may use, and the executor over
    their view of the pool."""

    key: KeySpec | None
    ceiling: Budget
    executor: Executor


def _stores(
    program: Conductor, keys: KeyStore | None, audit_db: str | Path | None, questions: bool, fields: Iterable[str]
) -> tuple[AuditLog | None, SpendLedger | None]:
    """The audit log and the spend ledger (both in ``audit_db``, if given), after checking ``keys`` fit them and the
    pool."""
    if keys is None:
        logger.warning("no API keys are configured: anyone who can reach this server may use it")
    problems = worker_problems(keys.keys, program.pool.names) if keys is not None else []
    if keys is not None and keys.has_daily_limits and audit_db is None:
        problems.append("keys with daily limits need a database to count spend in: pass audit_db")
    if problems:
        raise ConfigError("; ".join(problems))
    if audit_db is None:
        return None, None
    audit = AuditLog(audit_db, sensitive_fields=fields, secrets=_secrets(program), store_questions=questions)
    return audit, SpendLedger(audit_db) if keys is not None else None


def _secrets(program: Conductor) -> list[str]:
    """The provider keys the program uses: those named by the pool's ``api_key_env`` and the conductor LM's own."""
    spec = program.pool.spec
    names = [worker.api_key_env for worker in spec.workers if worker.api_key_env] if spec is not None else []
    lm = program.orchestrate.lm
    return [os.environ.get(name, "") for name in names] + [str(lm.kwargs.get("api_key") or "") if lm else ""]


def _executor_for(program: Conductor, key: KeySpec) -> Executor:
    """The program's executor over ``key``'s view of the pool: the same workers at the same indices, but no failover
    to a worker the key may not use."""
    pool = program.pool
    if all(key.allows(name) for name in pool.names):
        return program.executor
    allowed = [name for name in pool.names if key.allows(name)]
    return program.copy_with(pool=pool.subset(range(len(pool)), fallback_to=allowed)).executor


@dataclasses.dataclass(frozen=True)
class _Runner:
    """Runs requests for ``program`` under their caller's rules (on a server thread) and audits each one."""

    program: Conductor
    ledger: SpendLedger | None
    audit: AuditLog | None

    def __call__(self, caller: _Caller, inputs: dict[str, Any], budget: Budget, entry: AuditEntry) -> dspy.Prediction:
        """Run one request and append what it did to the audit log, whatever happened. An audit log that can't be
        written fails the request: no answer goes out unrecorded."""
        program, started, prediction = self.program, time.perf_counter(), None
        try:
            question = program.question_text(inputs)
            if isinstance(question, RunError):
                prediction = program.no_answer(question)
            else:
                entry.question = question
                prediction = self._run(caller, question, budget, entry)
            entry.outcome = prediction.error.kind if prediction.error is not None else "ok"
            return prediction
        except RequestError as exc:
            entry.outcome, entry.error = _OUTCOMES.get(exc.status, "error"), exc.message
            raise
        except Exception as exc:
            entry.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.audit is not None:
                if prediction is not None:
                    _record(entry, prediction)
                entry.latency_s = time.perf_counter() - started
                self.audit.write(entry)

    def _run(self, caller: _Caller, question: str, budget: Budget, entry: AuditEntry) -> dspy.Prediction:
        """``Conductor.forward`` with the caller's rules around it: the day's spend reserved first, the workflow (or
        the fallback) checked against the key's workers before any runs, the reservation settled to the real spend."""
        program = self.program
        reservation = _reserve(self.ledger, caller.key, budget)
        prediction = None
        try:

            def check(workflow: Workflow, format_error: RunError | None) -> None:
                entry.workflow = workflow.to_text()
                _check_workers(program.pool, caller.key, workflow, format_error)

            reply = program.ask(question, budget=budget)
            prediction = program.run_reply(question, reply, executor=caller.executor, budget=budget, check=check)
            return prediction
        finally:
            if reservation is not None:
                spent = (prediction.cost, prediction.tokens) if prediction is not None else (0.0, 0)
                self.ledger.settle(reservation, *spent)


def _reserve(ledger: SpendLedger | None, key: KeySpec | None, budget: Budget) -> Reservation | None:
    if ledger is None or key is None:
        return None
    try:
        return ledger.reserve(key, budget)
    except SpendLimitExceeded as exc:
        raise RequestError(429, str(exc), "daily_limit_exceeded", "rate_limit_error") from None


def _check_workers(pool: WorkerPool, key: KeySpec | None, workflow: Workflow, format_error: RunError | None) -> None:
    """Refuse (403) a workflow that would call a worker ``key`` may not use; nothing has been called yet."""
    names = [pool[step.worker].name for step in workflow.steps]
    forbidden = list(dict.fromkeys(name for name in names if key is not None and not key.allows(name)))
    if not forbidden:
        return
    if format_error is not None:
        why = f"the conductor's workflow is unusable ({format_error.message}) and its fallback would call"
    else:
        why = "the conductor's workflow calls"
    raise RequestError(
        403,
        f"{why} worker(s) {forbidden}, which key {key.id!r} may not use (it may use {list(key.workers or ())}); "
        "no worker was called",
        "worker_forbidden",
        "permission_error",
    )


def _record(entry: AuditEntry, prediction: dspy.Prediction) -> None:
    """Copy into ``entry`` what the run did and cost."""
    result = _result(prediction)
    entry.workers = [step.answered_by for step in result.steps]
    entry.prompt_tokens, entry.completion_tokens = result.prompt_tokens, result.completion_tokens
    entry.cost = result.cost
    entry.cost_by_step, entry.cost_by_worker = result.cost_by_step(), result.cost_by_worker()
    entry.error = entry.error or (str(result.error) if result.error is not None else None)


def _result(prediction: dspy.Prediction) -> RunResult:
    """The run behind ``prediction``, for its token and cost totals (the conductor's own included) and splits."""
    return RunResult(
        prediction.response, prediction.trace, prediction.error, prediction.workflow, prediction.conductor_usage
    )


async def _read_body(request: Any, limit: int) -> bytes:
    """The body, or a 413 as soon as it (or its declared length) passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"the request body is larger than {limit:,} bytes", "request_too_large")


def _parse(body: bytes) -> _ChatRequest:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a number of over 4,300 digits, deep nesting
        raise RequestError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object", "invalid_request")
    try:
        return _ChatRequest.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(validation_problems(exc, "(body)"))
        param = ".".join(str(part) for part in exc.errors()[0]["loc"]) or None
        raise RequestError(400, f"invalid request: {problems}", "invalid_request", param=param) from None


def _unknown_model(name: str, model: str) -> RequestError:
    return RequestError(
        404, f"the model {name!r} does not exist: this server serves {model!r}", "model_not_found", param="model"
    )


def _check_request(chat: _ChatRequest, model: str) -> None:
    """A 404 for another model; a 400 for a parameter the program can't honour (see the module docstring), rather
    than ignoring it."""
    if chat.model is not None and chat.model != model:
        raise _unknown_model(chat.model, model)
    if chat.n not in (None, 1):
        raise RequestError(400, f"n={chat.n}: the program writes one answer per request", "unsupported", param="n")
    kind = (chat.response_format or {}).get("type", "text")
    if kind != "text":
        raise RequestError(
            400,
            f"response_format {kind!r} is not supported: the program answers in free text, send 'text'",
            "unsupported",
            param="response_format",
        )
    for name in ("tools", "functions"):
        if (chat.model_extra or {}).get(name):
            raise RequestError(
                400, f"{name} are not supported: the program calls no client tools", "unsupported", param=name
            )


def question_text(messages: list[_Message]) -> str:
    """The last user message's text (a string, or its text parts joined by newlines)."""
    user = next((m for m in reversed(messages) if m.role == "user"), None)
    if user is None or user.content is None:
        raise RequestError(400, "the messages hold no user message with content", "no_user_message", param="messages")
    if isinstance(user.content, str):
        text = user.content
    elif any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in user.content):
        raise RequestError(400, "only text content parts are supported", "unsupported_content", param="messages")
    else:
        text = "\n".join(part["text"] for part in user.content)
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # JSON's "\ud800" escapes decode to text no model or file can take
        raise RequestError(
            400,
            f"the question is not valid Unicode: a lone surrogate at character {exc.start}",
            "invalid_text",
            param="messages",
        ) from None
    return text


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


def _request_budget(ceiling: Budget, chat: _ChatRequest) -> Budget:
    """``ceiling`` lowered by the request's ``conductor_budget`` and ``max_tokens`` / ``max_completion_tokens``."""
    budget = _lowered(ceiling, chat.conductor_budget)
    asked = [limit for limit in (chat.max_tokens, chat.max_completion_tokens) if limit is not None]
    return _tighter(budget, Budget(max_tokens=min(asked))) if asked else budget


def _lowered(ceiling: Budget, requested: dict[str, Any] | None) -> Budget:
    """``ceiling`` with each limit the request sets lowered to it; a request can't raise a limit."""
    if not requested:
        return ceiling
    unknown = sorted(set(requested) - set(_BUDGET_FIELDS))
    if unknown:
        raise RequestError(
            400,
            f"conductor_budget has unknown fields {unknown}; use {list(_BUDGET_FIELDS)}",
            "budget",
            param="conductor_budget",
        )
    try:  # Budget refuses negative, NaN and infinite limits itself
        asked = pydantic.TypeAdapter(Budget).validate_python(requested)
    except pydantic.ValidationError as exc:
        problems = "; ".join(validation_problems(exc, "conductor_budget"))
        raise RequestError(400, f"invalid conductor_budget: {problems}", "budget", param="conductor_budget") from None
    return _tighter(ceiling, asked)


def _tighter(ceiling: Budget, cap: Budget) -> Budget:
    """Each of ``ceiling``'s limits, lowered to ``cap``'s where ``cap`` sets one: the smaller where both do (0 is a
    limit of zero, never "no limit"; only ``None`` is)."""
    limits = {}
    for name in _BUDGET_FIELDS:
        limit, value = getattr(ceiling, name), getattr(cap, name)
        limits[name] = value if limit is None else limit if value is None else min(limit, value)
    return Budget(**limits)


def _usage(result: RunResult) -> dict[str, int]:
    """OpenAI's ``usage``: every step's tokens and the conductor LM's own."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.tokens,
    }


def _new_id() -> str:
    """A new id, unique across processes (a random prefix per process) and cheap: no random bytes per request,
    whose system call hands the GIL to the run threads and waits to get it back."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def _fields(record: Any) -> dict[str, Any]:
    """A dataclass's fields, one level deep (``dataclasses.asdict`` deep-copies every value, a cost per request)."""
    return {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}


def _trace(prediction: dspy.Prediction, result: RunResult, budget: Budget, elapsed_s: float) -> dict[str, Any]:
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


@dataclasses.dataclass(frozen=True)
class _Completion:
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
