"""The app factory: ``create_app`` wires the server's parts (callers, runner, stores, the run slots) into a FastAPI app
with its routes, its OpenAI-shaped error handlers and request ids. The HTTP behaviour is ``conductor.deploy.server``'s
docstring."""

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from conductor.deploy._governance import KeyStore
from conductor.deploy.server._auth import Callers
from conductor.deploy.server._chat import ChatRoute
from conductor.deploy.server._ids import RequestIds
from conductor.deploy.server._replies import Replies
from conductor.deploy.server._request import unknown_model
from conductor.deploy.server._runner import Runner
from conductor.deploy.server._schema import RequestError
from conductor.deploy.server._spend import Stores, open_stores
from conductor.errors import ConfigError, MissingDependency
from conductor.modules import Budget, Conductor

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_CONCURRENCY = 16
_ROUTES = "POST /v1/chat/completions, GET /v1/models, GET /v1/models/{model} and GET /health"


def import_serving(name: str) -> ModuleType:
    """Import an optional serving dependency (fastapi, uvicorn), or say how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingDependency(f"serving a program needs {name}: pip install 'dspy-conductor[serve]'") from exc


def create_app(
    program: Conductor,
    *,
    model: str = "dspy-conductor",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    budget: Budget | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    keys: KeyStore | None = None,
    audit_db: str | Path | None = None,
    audit_questions: bool = False,
    sensitive_fields: Iterable[str] = (),
    docs: bool = False,
) -> "FastAPI":
    """A FastAPI app serving ``program`` as the model ``model``.

    Args:
        max_request_bytes: larger request bodies get a 413.
        request_timeout_s: a request not answered in time (waiting for a run slot included) gets a 504; a run that
            started then finishes in the background, so that its audit row holds what it spent.
        body_timeout_s: a request body not all received in time gets a 408 (a slow client holds no connection long).
        budget: the most a request's run may use (default: the program's own budget); a key's budget lowers it, and a
            request may lower it further (``max_tokens``, ``conductor_budget``) but never raise it.
        concurrency: how many runs at once (awaited on the event loop, so API workers hold no thread); more requests
            wait for a slot. It also caps the connections open to a PostgreSQL ``audit_db``.
        keys: the API keys allowed in; ``None`` leaves the server open to anyone who can reach it (logged).
        audit_db: the database of the audit log, the keys' daily spend (needed when a key has a daily limit) and keys
            stored there: a SQLite file path, or a ``postgresql://`` URL that replicas on several machines share.
            Without ``keys``, the keys stored in it (``conductor keys add --db``), if it ever held any, are the keys.
        audit_questions: keep questions in the audit log (redacted), not only their SHA-256.
        sensitive_fields: request fields never written to the audit log, on top of those named like a secret.
        docs: serve ``/docs``, ``/redoc`` and ``/openapi.json``, behind the same keys as the API (off by default).
    """
    fastapi = import_serving("fastapi")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1 (runs at once), not {concurrency}")
    ceiling = budget or program.executor.budget
    stores = open_stores(program, keys, audit_db, audit_questions, sensitive_fields, concurrency)
    if stores.keys is None:
        logger.warning("no API keys are configured: anyone who can reach this server may use it")
    runner = Runner(program, stores.ledger, stores.audit)
    callers = Callers(program, ceiling, stores.keys, stores.audit)
    replies = Replies(fastapi.Response)
    app = _bare_app(fastapi, model, stores, replies)
    run_slots = asyncio.Semaphore(concurrency)
    chat = ChatRoute(
        program, model, callers, runner, run_slots, replies, max_request_bytes, request_timeout_s, body_timeout_s
    )
    _add_routes(app, fastapi, chat)
    if docs:
        _add_docs(app, fastapi, callers, replies)
    return app


def _bare_app(fastapi: ModuleType, model: str, stores: Stores, replies: Replies) -> "FastAPI":
    """The app before its routes: request ids, OpenAI-shaped errors, no API docs, and a shutdown that closes the
    stores."""

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        stores.close()

    app = fastapi.FastAPI(
        title=f"dspy-conductor: {model}", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(RequestIds)
    _add_error_handlers(app, fastapi, replies)
    return app


def _add_routes(app: "FastAPI", fastapi: ModuleType, chat: ChatRoute) -> None:
    """``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /v1/models/{id}`` and ``GET /health``."""
    model, callers, replies = chat.model, chat.callers, chat.replies
    model_card = {"id": model, "object": "model", "created": 0, "owned_by": "dspy-conductor"}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: fastapi.Request) -> fastapi.Response:
        return await chat(request)

    @app.get("/v1/models")
    async def models(request: fastapi.Request) -> fastapi.Response:
        try:
            callers.of(request)
        except RequestError as exc:
            return replies.error(exc)
        return replies.json({"object": "list", "data": [model_card]})

    @app.get("/v1/models/{name:path}")
    async def one_model(request: fastapi.Request, name: str) -> fastapi.Response:
        try:
            callers.of(request)
            if name != model:
                raise unknown_model(name, model)
        except RequestError as exc:
            return replies.error(exc)
        return replies.json(model_card)

    @app.get("/health")
    async def health() -> fastapi.Response:
        return replies.json({"status": "ok", "model": model, "workers": chat.program.pool.names})


def _add_docs(app: "FastAPI", fastapi: ModuleType, callers: Callers, replies: Replies) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc`` behind the API's keys (FastAPI's own would answer anyone)."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    pages = {
        "/openapi.json": lambda: replies.json(app.openapi()),
        "/docs": lambda: get_swagger_ui_html(openapi_url="/openapi.json", title=app.title),
        "/redoc": lambda: get_redoc_html(openapi_url="/openapi.json", title=app.title),
    }

    def behind_keys(page: Callable[[], fastapi.Response]) -> Callable:
        async def route(request: fastapi.Request) -> fastapi.Response:
            try:
                callers.of(request)
            except RequestError as exc:
                return replies.error(exc)
            return page()

        return route

    for path, page in pages.items():
        app.get(path, include_in_schema=False)(behind_keys(page))


def _add_error_handlers(app: "FastAPI", fastapi: ModuleType, replies: Replies) -> None:
    """Every error as an OpenAI error object: Starlette's 404 and 405, and a bug's 500."""
    from starlette.exceptions import HTTPException

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
        return replies.error(error, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def server_error(request: fastapi.Request, exc: Exception) -> fastapi.Response:
        """A bug, as an OpenAI error (Starlette answers it outside the middleware, so the request id is set here)."""
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        error = RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error")
        return replies.error(error, {"x-request-id": request.state.request_id})
