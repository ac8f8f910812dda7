"""A served run's spend and its record: the database a server writes (SQLite or PostgreSQL) with its audit log, the
keys' daily spend ledger and any keys stored there, a key's share of the day reserved before its run (429 when it
won't fit), and what a run did and cost copied into its audit entry."""

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

import dspy

from conductor.deploy._audit import AuditEntry, AuditLog
from conductor.deploy._database import DEFAULT_MAX_CONNECTIONS, Database, open_database
from conductor.deploy._governance import (
    KeySpec,
    KeyStore,
    Reservation,
    SpendLedger,
    SpendLimitExceeded,
    worker_problems,
)
from conductor.deploy._stored_keys import StoredKeys
from conductor.deploy.server._schema import RequestError, run_result
from conductor.errors import ConfigError
from conductor.modules import Budget, Conductor

OUTCOMES = {
    401: "unauthorized",
    403: "forbidden",
    408: "timeout",
    429: "rate-limited",
    499: "disconnected",
    504: "timeout",
}
"""The audit outcomes of requests refused or cut short, by HTTP status (another 4xx is ``input``, a 5xx ``error``)."""


@dataclasses.dataclass(frozen=True)
class Stores:
    """What a server reads and writes: its keys (a file's, the database's, or ``None``: open), the audit log and the
    spend ledger (``None`` without a database, the ledger also without keys), in ``database``."""

    keys: KeyStore | StoredKeys | None
    audit: AuditLog | None
    ledger: SpendLedger | None
    database: Database | None

    def close(self) -> None:
        if self.database is not None:
            self.database.close()


def open_stores(
    program: Conductor,
    keys: KeyStore | None,
    audit_db: str | Path | Database | None,
    questions: bool,
    fields: Iterable[str],
    connections: int,
) -> Stores:
    """The server's stores in ``audit_db`` (a SQLite path or a ``postgresql://`` URL; at most ``connections`` open to
    PostgreSQL, and never more than ``DEFAULT_MAX_CONNECTIONS``: a transaction takes milliseconds, so a few carry
    a process's every request), after checking the keys fit them and the pool. Without a keys file, keys stored in
    the database (``conductor keys add --db``) are the server's keys."""
    connections = min(connections, DEFAULT_MAX_CONNECTIONS)
    database = open_database(audit_db, max_connections=connections) if audit_db is not None else None
    try:
        keys = _server_keys(keys, database)
        problems = worker_problems(keys.keys, program.pool.names) if keys is not None else []
        if keys is not None and keys.has_daily_limits and database is None:
            problems.append("keys with daily limits need a database to count spend in: pass audit_db")
        if problems:
            raise ConfigError("; ".join(problems))
    except BaseException:
        if database is not None:
            database.close()
        raise
    if database is None:
        return Stores(keys, None, None, None)
    audit = AuditLog(database, sensitive_fields=fields, secrets=_secrets(program), store_questions=questions)
    return Stores(keys, audit, SpendLedger(database) if keys is not None else None, database)


def _server_keys(keys: KeyStore | None, database: Database | None) -> KeyStore | StoredKeys | None:
    """The keys file's keys, else the database's if it ever held any; both is an error."""
    stored = StoredKeys(database) if database is not None else None
    if stored is None or not stored.any_added():
        return keys
    if keys is not None:
        raise ConfigError(
            f"keys come from one place: {database.name} holds keys (`conductor keys list --db`) and a keys file was "
            "given too; move the file's keys into the database (`conductor keys add --db`) or use another database"
        )
    return stored


def _secrets(program: Conductor) -> list[str]:
    """The provider keys the program uses: those named by the pool's ``api_key_env`` and the conductor LM's own."""
    spec = program.pool.spec
    names = [worker.api_key_env for worker in spec.workers if worker.api_key_env] if spec is not None else []
    lm = program.orchestrate.lm
    return [os.environ.get(name, "") for name in names] + [str(lm.kwargs.get("api_key") or "") if lm else ""]


def reserve(ledger: SpendLedger, key: KeySpec, budget: Budget) -> Reservation:
    """Hold ``budget`` against ``key``'s daily limits; a 429 when it won't fit."""
    try:
        return ledger.reserve(key, budget)
    except SpendLimitExceeded as exc:
        raise RequestError(429, str(exc), "daily_limit_exceeded", "rate_limit_error") from None


def record(entry: AuditEntry, prediction: dspy.Prediction) -> None:
    """Copy into ``entry`` what the run did and cost."""
    result = run_result(prediction)
    entry.workers = [step.answered_by for step in result.steps]
    entry.prompt_tokens, entry.completion_tokens = result.prompt_tokens, result.completion_tokens
    entry.cost = result.cost
    entry.cost_by_step, entry.cost_by_worker = result.cost_by_step(), result.cost_by_worker()
    entry.error = entry.error or (str(result.error) if result.error is not None else None)
