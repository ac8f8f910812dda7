"""An append-only audit log of who ran what on the server, in SQLite, with secrets redacted before anything is written.

One row per chat request, refused ones included (``outcome`` and ``error`` say why): when, the request id (the
``x-request-id`` header), the key id (never the key), the program, the workflow the conductor wrote, the workers that
answered each step, tokens, cost split by step and by worker, the outcome and the latency. The question is kept only
as its SHA-256 unless ``store_questions`` is set. Text that can't be UTF-8 (a client's lone surrogate) is written with
backslash escapes.

Append-only: the code only ever inserts, and triggers make SQLite refuse any UPDATE or DELETE of a row. Redaction:
a request parameter named like a secret (``api_key``, ``authorization``, ... and the names configured) is written as
``[REDACTED]``, and every configured secret value (the raw API keys this process has seen, the pool's provider keys)
is replaced wherever it appears in a string, in every column.

The database file also holds the key ledger (``_governance.SpendLedger``); both open a connection per operation
(``transaction``), so threads and processes sharing the file never share a connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from conductor.deploy._artifact import SECRET_PARTS
from conductor.errors import ConductorError

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 8
"""Shorter secrets are redacted only where a whole value equals them: replacing them inside text would mangle it."""

Outcome = Literal["ok", "format", "execution", "budget", "input", "unauthorized", "forbidden", "rate-limited", "error"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts TEXT NOT NULL,
    request_id TEXT NOT NULL,
    key_id TEXT,
    program TEXT NOT NULL,
    outcome TEXT NOT NULL,
    error TEXT,
    question TEXT,
    question_sha256 TEXT,
    request TEXT NOT NULL,
    workflow TEXT,
    workers TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost REAL NOT NULL,
    cost_by_step TEXT NOT NULL,
    cost_by_worker TEXT NOT NULL,
    latency_s REAL NOT NULL
);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""
_JSON_COLUMNS = ("request", "workers", "cost_by_step", "cost_by_worker")


@contextlib.contextmanager
def transaction(path: Path, *, timeout_s: float = 30.0) -> Iterator[sqlite3.Connection]:
    """A fresh connection to ``path`` inside ``BEGIN IMMEDIATE`` (the write lock taken up front, so a read-then-write
    can't race another writer); committed on success, rolled back on error, closed either way."""
    db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    finally:
        db.close()


def create_schema(path: Path, schema: str) -> None:
    """Create ``schema``'s tables in the database at ``path`` (write-ahead logging: readers don't block writers)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(path, timeout=30.0, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(schema)
    except (OSError, sqlite3.Error) as exc:
        raise ConductorError(f"can't open the database {path}: {exc}") from exc


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
    """The audit table in the SQLite database at ``path``. Thread-safe; several processes may share the file.

    Args:
        sensitive_fields: field names whose values are never written, on top of those named like a secret.
        secrets: values never written (more can be added with ``add_secret``).
        store_questions: keep the question text (redacted); by default only its SHA-256 is kept.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        sensitive_fields: Iterable[str] = (),
        secrets: Iterable[str] = (),
        store_questions: bool = False,
    ):
        self.path = Path(path).expanduser().absolute()
        self.sensitive_fields = frozenset(_field_name(name) for name in sensitive_fields)
        self.store_questions = store_questions
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        for secret in secrets:
            self.add_secret(secret)
        create_schema(self.path, _SCHEMA)

    def add_secret(self, value: str) -> None:
        """Never write ``value``."""
        if value:
            with self._lock:
                self._secrets.add(value)

    def write(self, entry: AuditEntry) -> None:
        """Append ``entry``, redacted."""
        question = entry.question
        row = dataclasses.asdict(entry) | {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "question": question if self.store_questions else None,
            "question_sha256": _sha256(question) if question is not None else None,
        }
        row = {column: self.redact(value, by_name=column == "request") for column, value in row.items()}
        for column in _JSON_COLUMNS:
            row[column] = json.dumps(row[column], ensure_ascii=False)
        columns = ", ".join(row)
        with transaction(self.path) as db:
            db.execute(f"INSERT INTO audit ({columns}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))

    def read(self) -> list[dict[str, Any]]:
        """Every row, oldest first, JSON columns decoded."""
        with contextlib.closing(sqlite3.connect(self.path, timeout=30.0)) as db:
            db.row_factory = sqlite3.Row
            rows = [dict(row) for row in db.execute("SELECT * FROM audit ORDER BY seq")]
        for row in rows:
            for column in _JSON_COLUMNS:
                row[column] = json.loads(row[column])
        return rows

    def redact(self, value: Any, *, by_name: bool = True) -> Any:
        """``value`` with secret values, and (``by_name``) the values of sensitive fields, replaced by ``[REDACTED]``
        at any depth. Only the request's parameters are redacted by name: the other columns' keys are worker names
        and step numbers, not fields a client chose."""
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)  # a secret inside a longer one: the longer first
        return self._redact(value, secrets, by_name)

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
    """``text`` as SQLite can store it: a lone surrogate (JSON's ``"\\ud800"`` decodes to one) can't be encoded as
    UTF-8, so it is written as its escape."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def _sha256(text: str) -> str:
    """The SHA-256 of ``text``'s UTF-8 bytes (a lone surrogate as the three bytes Python's ``surrogatepass`` gives)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _field_name(name: str) -> str:
    """``X-Api-Key`` and ``api_key`` alike: lower case, words joined by ``_``."""
    return name.lower().replace("-", "_")
