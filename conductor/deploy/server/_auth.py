"""Who asks, and what they may use: the caller a request's API key names (401 without a valid one, when the server
has keys), the most a run of theirs may spend, the executor over the workers their key allows, and the 403 for a
workflow that would call any other worker."""

import dataclasses
from typing import Any

from conductor.deploy._audit import AuditLog
from conductor.deploy._governance import KeySpec, KeyStore
from conductor.deploy._stored_keys import StoredKeys
from conductor.deploy.server._budget import tighter
from conductor.deploy.server._schema import RequestError, storage
from conductor.modules import Budget, Conductor, Executor, RunError, WorkerPool, Workflow

_AUTH = "authentication_error"


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who asks: their key (``None`` on an open server), the most a run of theirs may use, and the executor over
    their view of the pool."""

    key: KeySpec | None
    ceiling: Budget
    executor: Executor


class Callers:
    """The callers of a server over ``program``: one per key in ``keys`` (a keys file's, or the database's, looked up
    on each request so a revoked key is refused at once), or anyone when ``keys`` is ``None``; a key used is added to
    ``audit``'s secrets, so the audit log never holds it."""

    def __init__(self, program: Conductor, ceiling: Budget, keys: KeyStore | StoredKeys | None, audit: AuditLog | None):
        self.program, self.ceiling, self.keys, self.audit = program, ceiling, keys, audit
        self.anyone = Caller(None, ceiling, program.executor)
        self._by_spec: dict[KeySpec, Caller] = {}  # built on a key's first request: stored keys may come later

    @property
    def queries_database(self) -> bool:
        """Whether ``of`` looks keys up in the database (stored keys), so that it blocks on I/O."""
        return isinstance(self.keys, StoredKeys)

    def of(self, request: Any) -> Caller:
        """The caller a request's ``Authorization: Bearer <key>`` names; anyone on an open server; else a 401."""
        if self.keys is None:
            return self.anyone
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise RequestError(
                401, "an API key is needed: send `Authorization: Bearer <key>`", "missing_api_key", _AUTH
            )
        with storage("check API keys"):  # stored keys are a database query, which may fail
            key = self.keys.authenticate(token)
        if key is None:
            raise RequestError(401, "the API key is not valid", "invalid_api_key", _AUTH)
        if self.audit is not None:
            self.audit.add_secret(token)
        if key not in self._by_spec:  # two threads may both build it: the same caller, one kept
            executor = _executor_for(self.program, key)
            self._by_spec[key] = Caller(key, tighter(self.ceiling, key.budget), executor)
        return self._by_spec[key]


def _executor_for(program: Conductor, key: KeySpec) -> Executor:
    """The program's executor over ``key``'s view of the pool: the same workers at the same indices, but no failover
    to a worker the key may not use."""
    pool = program.pool
    if all(key.allows(name) for name in pool.names):
        return program.executor
    allowed = [name for name in pool.names if key.allows(name)]
    return program.copy_with(pool=pool.subset(range(len(pool)), fallback_to=allowed)).executor


def check_workers(pool: WorkerPool, key: KeySpec | None, workflow: Workflow, format_error: RunError | None) -> None:
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
