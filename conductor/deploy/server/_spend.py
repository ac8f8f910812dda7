"""A served run's spend and its record: the audit log and the keys' daily spend ledger a server writes (both in one
SQLite file), a key's share of the day reserved before its run (429 when it won't fit), and what a run did and cost
copied into its audit entry."""

import os
from collections.abc import Iterable
from pathlib import Path

import dspy

from conductor.deploy._audit import AuditEntry, AuditLog
from conductor.deploy._governance import (
    KeySpec,
    KeyStore,
    Reservation,
    SpendLedger,
    SpendLimitExceeded,
    worker_problems,
)
from conductor.deploy.server._schema import RequestError, run_result
from conductor.errors import ConfigError
from conductor.modules import Budget, Conductor

OUTCOMES = {401: "unauthorized", 403: "forbidden", 429: "rate-limited"}
"""The audit outcomes of refused requests, by HTTP status."""


def open_stores(
    program: Conductor, keys: KeyStore | None, audit_db: str | Path | None, questions: bool, fields: Iterable[str]
) -> tuple[AuditLog | None, SpendLedger | None]:
    """The audit log and the spend ledger (both in ``audit_db``, if given), after checking ``keys`` fit them and the
    pool."""
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


def reserve(ledger: SpendLedger | None, key: KeySpec | None, budget: Budget) -> Reservation | None:
    """Hold ``budget`` against ``key``'s daily limits (nothing to hold without a ledger or a key); a 429 when it
    won't fit."""
    if ledger is None or key is None:
        return None
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
