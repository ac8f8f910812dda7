"""An append-only audit log of who ran what on the server, in its database, with secrets redacted before anything is
written.

One row per chat request, refused ones included (``outcome`` and ``error`` say why): when, the request id (the
``x-request-id`` header), the key id (never the key), the program, the workflow the conductor wrote, the workers that
answered each step, tokens, cost split by step and by worker, the outcome and the latency. The question is kept only
as its SHA-256 unless ``store_questions`` is set. Text that can't be UTF-8 (a client's lone surrogate) and NUL
characters (which PostgreSQL's text can't hold) are written as backslash escapes.

Append-only: the code only ever inserts, and triggers make the database refuse any UPDATE or DELETE of a row (and,
in PostgreSQL, a TRUNCATE). Redaction:
a request parameter named like a secret (``api_key``, ``authorization``, ... and the names configured) is written as
``[REDACTED]``, and every configured secret value (the raw API keys this process has seen, the pool's provider keys)
is replaced wherever it appears in a string, in every column.

The database (SQLite or PostgreSQL, ``_database``) also holds the key ledger (``_governance.SpendLedger``); each write
is one transaction on a connection of its own, so threads, processes and replicas sharing it never share one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from conductor.deploy._artifact import SECRET_PARTS
from conductor.deploy._database import Database, open_database, rows

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 8
"""Shorter secrets are redacted only where a whole value equals them: replacing them inside text would mangle it."""

Outcome = Literal[
    "ok",
    "format",
    "execution",
    "budget",
    "input",
    "unauthorized",
    "forbidden",
    "rate-limited",
    "timeout",
    "disconnected",
    "error",
]

_JSON_COLUMNS = ("request", "workers", "cost_by_step", "cost_by_worker")


@dataclasses.dataclass
class AuditEntry:
    """What one request ran and what it cost. ``workers`` holds, per step, the worker that answered (``None``: none
    did); ``request`` the request's parameters other than its messages."""

    request_id: str
    program: str
    outcome: Outcome
    key_id: str | None = None
    error: str | None = None
    question: str | None = None
    request: dict[str, Any] = dataclasses.field(default_factory=dict)
    workflow: str | None = None
    workers: list[str | None] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    cost_by_step: dict[int, float] = dataclasses.field(default_factory=dict)
    cost_by_worker: dict[str, float] = dataclasses.field(default_factory=dict)
    latency_s: float = 0.0


class AuditLog:
    """The audit table in ``database``: a SQLite file path, a ``postgresql://`` URL or an open ``Database``.
    Thread-safe; several processes (and, with PostgreSQL, replicas on several machines) may share it.

    Args:
        sensitive_fields: field names whose values are never written, on top of those named like a secret.
        secrets: values never written (more can be added with ``add_secret``).
        store_questions: keep the question text (redacted); by default only its SHA-256 is kept.
    """

    def __init__(
        self,
        database: str | Path | Database,
        *,
        sensitive_fields: Iterable[str] = (),
        secrets: Iterable[str] = (),
        store_questions: bool = False,
    ):
        self.database = open_database(database)
        self.sensitive_fields = frozenset(_field_name(name) for name in sensitive_fields)
        self.store_questions = store_questions
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        for secret in secrets:
            self.add_secret(secret)

    def add_secret(self, value: str) -> None:
        """Never write ``value``."""
        if value:
            with self._lock:
                self._secrets.add(value)

    def write(self, entry: AuditEntry) -> None:
        """Append ``entry``, redacted."""
        question = entry.question
        row = vars(entry) | {  # a shallow copy: redacting copies what it keeps of the entry's dicts and lists
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "question": question if self.store_questions else None,
            "question_sha256": _sha256(question) if question is not None else None,
        }
        secrets = self._secrets_longest_first()
        row = {column: self._redact(value, secrets, column == "request") for column, value in row.items()}
        for column in _JSON_COLUMNS:
            row[column] = json.dumps(row[column], ensure_ascii=False)
        columns = ", ".join(row)
        with self.database.transaction() as db:
            db.execute(f"INSERT INTO audit ({columns}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))

    def read(self) -> list[dict[str, Any]]:
        """Every row, oldest first, JSON columns decoded."""
        with self.database.transaction() as db:
            records = rows(db.execute("SELECT * FROM audit ORDER BY seq"))
        for record in records:
            for column in _JSON_COLUMNS:
                record[column] = json.loads(record[column])
        return records

    def redact(self, value: Any, *, by_name: bool = True) -> Any:
        """``value`` with secret values, and (``by_name``) the values of sensitive fields, replaced by ``[REDACTED]``
        at any depth. Only the request's parameters are redacted by name: the other columns' keys are worker names
        and step numbers, not fields a client chose."""
        return self._redact(value, self._secrets_longest_first(), by_name)

    def _secrets_longest_first(self) -> list[str]:
        with self._lock:
            return sorted(self._secrets, key=len, reverse=True)  # a secret inside a longer one: the longer first

    def _redact(self, value: Any, secrets: list[str], by_name: bool) -> Any:
        if isinstance(value, dict):
            return {
                _storable(str(k)): REDACTED
                if by_name and self._is_sensitive(str(k))
                else self._redact(v, secrets, by_name)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self._redact(v, secrets, by_name) for v in value]
        if isinstance(value, str):
            for secret in secrets:
                if value == secret:
                    return REDACTED
                if len(secret) >= MIN_SECRET_CHARS:
                    value = value.replace(secret, REDACTED)
            return _storable(value)
        return value

    def _is_sensitive(self, name: str) -> bool:
        name = _field_name(name)
        return name in self.sensitive_fields or bool(SECRET_PARTS & set(name.split("_")))


def _storable(text: str) -> str:
    """``text`` as every database can store it: a lone surrogate (JSON's ``"\\ud800"`` decodes to one) can't be
    encoded as UTF-8, and PostgreSQL's text can't hold a NUL character, so each is written as its escape."""
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text.replace("\x00", "\\x00")


def _sha256(text: str) -> str:
    """The SHA-256 of ``text``'s UTF-8 bytes (a lone surrogate as the three bytes Python's ``surrogatepass`` gives)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _field_name(name: str) -> str:
    """``X-Api-Key`` and ``api_key`` alike: lower case, words joined by ``_``."""
    return name.lower().replace("-", "_")
