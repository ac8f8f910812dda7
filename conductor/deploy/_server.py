"""One program as one model behind an OpenAI-compatible HTTP API: ``POST /v1/chat/completions``, ``GET /v1/models``
and ``GET /health``.

A thin layer over the library: the question (the last user message) goes to the ``Conductor``, which writes a
workflow (``Conductor.ask``); the workflow is checked against the caller's key and run by the program's executor;
the prediction comes back as a ``chat.completion`` whose extra ``conductor`` field holds the workflow, the per-step
trace, tokens, cost (split by step and by worker) and the run's error, if any. Runs are synchronous, so they go to a
bounded thread pool. Streaming is not supported yet: ``stream: true`` is refused with a 400.

Governance (``_governance.py``, ``_audit.py``): with a ``KeyStore``, every request needs ``Authorization: Bearer
<key>`` (else 401); a workflow that would call a worker the key may not use is refused with a 403 before any worker
runs (the conductor's fallback included), and failover never reaches such a worker; a key's daily limits are held
with a reservation in SQLite before the run (429 when it won't fit). With ``audit_db``, every run is appended to the
audit log, redacted.

Needs FastAPI (``pip install 'dspy-conductor[serve]'``), imported only when an app is made.
"""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib
import json
import logging
import os
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
from conductor.errors import ConfigError, MissingDependency, validation_problems
from conductor.modules import Budget, Conductor, Executor, RunError, RunResult, WorkerPool, Workflow

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
            request may lower it further with a ``conductor_budget`` object (fields of ``Budget``) but never raise it.
        concurrency: how many runs at once; more requests wait for a thread.
        keys: the API keys allowed in; ``None`` leaves the server open to anyone who can reach it (logged).
        audit_db: the SQLite file of the audit log and of the keys' daily spend (needed when a key has a daily limit).
        audit_questions: keep questions in the audit log (redacted), not only their SHA-256.
        sensitive_fields: request fields never written to the audit log, on top of those named like a secret.
    """
    fastapi = import_serving("fastapi")
    from fastapi.responses import JSONResponse

    ceiling = budget or program.executor.budget
    audit, ledger = _stores(program, keys, audit_db, audit_questions, sensitive_fields)
    runner = _Runner(program, ledger, audit)
    callers = {key.id: _Caller(key, _tighter(ceiling, key.budget), _executor_for(program, key)) for key in keys or ()}
    anyone = _Caller(None, ceiling, program.executor)
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="conductor-run")

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        threads.shutdown(wait=False, cancel_futures=True)

    app = fastapi.FastAPI(title=f"dspy-conductor: {model}", lifespan=lifespan)

    def refuse(error: RequestError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

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

    @app.post("/v1/chat/completions")
    async def chat_completions(request: fastapi.Request) -> JSONResponse:
        try:
            caller = caller_of(request)
            chat = _parse(await _read_body(request, max_request_bytes))
            inputs = _inputs(program.signature, question_text(chat.messages))
            run_budget = _lowered(caller.ceiling, chat.conductor_budget)
        except RequestError as exc:
            return refuse(exc)
        entry = AuditEntry(
            f"chatcmpl-{uuid.uuid4().hex}",
            model,
            "error",
            key_id=caller.key.id if caller.key is not None else None,
            request=chat.model_dump(exclude={"messages"}),
        )
        started = time.perf_counter()
        future = threads.submit(runner, caller, inputs, run_budget, entry)
        try:
            prediction = await asyncio.wait_for(asyncio.wrap_future(future), request_timeout_s)
        except TimeoutError:
            return refuse(RequestError(504, f"no answer within {request_timeout_s:g} s", "timeout", "timeout_error"))
        except RequestError as exc:
            return refuse(exc)
        except Exception as exc:
            logger.exception("the program failed")
            return refuse(RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error"))
        if prediction.error is not None and prediction.error.kind == "input":
            return refuse(RequestError(400, prediction.error.message, "invalid_input"))
        elapsed = time.perf_counter() - started
        return JSONResponse(_completion(program, prediction, model, run_budget, elapsed, entry.request_id))

    @app.get("/v1/models")
    async def models(request: fastapi.Request) -> JSONResponse:
        try:
            caller_of(request)
        except RequestError as exc:
            return refuse(exc)
        data = [{"id": model, "object": "model", "created": 0, "owned_by": "dspy-conductor"}]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model, "workers": program.pool.names}

    return app


_AUTH = "authentication_error"
_OUTCOMES = {403: "forbidden", 429: "rate-limited"}  # the audit outcome of a refused run, by HTTP status


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
        problems = "; ".join(validation_problems(exc, "(body)"))
        raise RequestError(400, f"invalid request: {problems}", "invalid_request") from None
    if chat.stream:
        raise RequestError(400, "streaming is not supported yet: send `stream: false`", "stream_unsupported")
    return chat


def question_text(messages: list[_Message]) -> str:
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
    try:  # Budget refuses negative, NaN and infinite limits itself
        asked = pydantic.TypeAdapter(Budget).validate_python(requested)
    except pydantic.ValidationError as exc:
        problems = "; ".join(validation_problems(exc, "conductor_budget"))
        raise RequestError(400, f"invalid conductor_budget: {problems}", "budget") from None
    return _tighter(ceiling, asked)


def _tighter(ceiling: Budget, cap: Budget) -> Budget:
    """Each of ``ceiling``'s limits, lowered to ``cap``'s where ``cap`` sets one: the smaller where both do (0 is a
    limit of zero, never "no limit"; only ``None`` is)."""
    limits = {}
    for name in _BUDGET_FIELDS:
        limit, value = getattr(ceiling, name), getattr(cap, name)
        limits[name] = value if limit is None else limit if value is None else min(limit, value)
    return Budget(**limits)


def _completion(
    program: Conductor, prediction: dspy.Prediction, model: str, budget: Budget, elapsed_s: float, request_id: str
) -> dict[str, Any]:
    answer = prediction[next(iter(program.signature.output_fields))]
    result = _result(prediction)
    error = result.error
    return {
        "id": request_id,
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
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.tokens,
        },
        "conductor": {
            "workflow": prediction.workflow.to_text() if prediction.workflow is not None else None,
            "response": prediction.response,
            "steps": [dataclasses.asdict(step) for step in result.steps],
            "tokens": result.tokens,
            "cost": result.cost,
            "cost_by_step": result.cost_by_step(),
            "cost_by_worker": result.cost_by_worker(),
            "conductor_usage": dataclasses.asdict(result.conductor_usage),
            "latency_s": elapsed_s,
            "budget": dataclasses.asdict(budget),
            "error": dataclasses.asdict(error) if error is not None else None,
        },
    }
