"""The database a served program writes: the audit log, the keys' daily spend and the API keys kept there, in SQLite
(a file path: the processes of one machine) or PostgreSQL (a ``postgresql://`` URL: replicas on several machines).

``open_database`` takes either. Both kinds give the same guarantees through one interface: ``transaction()`` runs
statements (written with ``?`` placeholders) in one transaction, committed on success and rolled back on error, on a
connection no other thread holds. Exact daily limits need a read-then-write no other writer can interleave:
SQLite's ``BEGIN IMMEDIATE`` takes the whole file's write lock up front, and PostgreSQL locks the rows a ``SELECT``
reads with ``row_lock`` (``FOR UPDATE``) until the transaction ends, so only requests of the same key wait for each
other, and a replica that dies mid-transaction releases its locks with its connection.

The schema is the library's: created on first use and versioned in the ``conductor_schema`` table, one migration per
version, applied under a lock so that replicas starting together migrate once. A database of a newer version than
this library knows is refused with a clear error rather than written in a shape the library doesn't know.
PostgreSQL needs ``pip install 'dspy-conductor[postgres]'`` (psycopg and its connection pool).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import importlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from conductor.errors import ConductorError, ConfigError, MissingDependency

SCHEMA_VERSION = 1
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
DEFAULT_MAX_CONNECTIONS = 16
"""A PostgreSQL replica's most open connections (and threads running transactions)."""

_AUDIT = """CREATE TABLE IF NOT EXISTS audit (
    seq {seq},
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
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    cost_by_step TEXT NOT NULL,
    cost_by_worker TEXT NOT NULL,
    latency_s DOUBLE PRECISION NOT NULL
)"""
_DAILY_SPEND = """CREATE TABLE IF NOT EXISTS daily_spend (
    key_id TEXT NOT NULL,
    day TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    spent_nanodollars BIGINT NOT NULL DEFAULT 0,
    spent_tokens BIGINT NOT NULL DEFAULT 0,
    held_nanodollars BIGINT NOT NULL DEFAULT 0,
    held_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, day)
)"""
_API_KEYS = """CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    spec TEXT NOT NULL,
    created TEXT NOT NULL,
    revoked TEXT
)"""
_APPEND_ONLY = "the audit log is append-only"
T = TypeVar("T")
_making_threads = threading.Lock()

# One tuple of statements per schema version, by dialect. Version 1's use IF NOT EXISTS: SQLite files written before
# the schema had a version already hold its first two tables.
_MIGRATIONS: dict[str, list[tuple[str, ...]]] = {
    "sqlite": [
        (
            _AUDIT.format(seq="INTEGER PRIMARY KEY AUTOINCREMENT"),
            f"CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit "
            f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END",
            f"CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit "
            f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END",
            _DAILY_SPEND,
            _API_KEYS,
        )
    ],
    "postgresql": [
        (
            _AUDIT.format(seq="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
            "CREATE OR REPLACE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{_APPEND_ONLY}'; END $$",
            "CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit "
            "FOR EACH ROW EXECUTE FUNCTION audit_append_only()",
            "CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only()",
            _DAILY_SPEND,
            _API_KEYS,
        )
    ],
}


class Database(abc.ABC):
    """Where the audit log, the spend ledger and stored keys live. Thread-safe: each ``transaction()`` has a
    connection of its own; processes (and, for PostgreSQL, machines) may share the database.

    ``name`` says which database, without a password; ``row_lock`` is the clause that makes a ``SELECT`` lock the
    rows it reads until the transaction ends (empty where a transaction already excludes every other writer).

    Async code hands its blocking work to ``run`` (or ``submit``): it runs on threads of the database's own, at most
    ``transactions_at_once`` of them, not on the event loop's default pool, which DSPy's LM calls hop through: there,
    transactions waiting for a lock held threads that the calls of runs in flight queued for.
    """

    dialect: str
    name: str
    row_lock: str = ""
    transactions_at_once: int = 1
    _threads: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None  # (the process it was made in, it)

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A connection with ``execute(sql, params)`` (``?`` placeholders) inside one transaction: committed when the
        block ends, rolled back if it raises."""

    def submit(self, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``call`` (blocking work on this database) on one of its threads."""
        with _making_threads:
            threads = self._threads
            if threads is None or threads[0] != os.getpid():  # a forked child has none of its parent's threads
                pool = concurrent.futures.ThreadPoolExecutor(
                    self.transactions_at_once, thread_name_prefix="conductor-db"
                )
                threads = self._threads = (os.getpid(), pool)
        return threads[1].submit(call)

    async def run(self, call: Callable[[], T]) -> T:
        """``call()``'s result, run on one of the database's threads while the event loop goes on."""
        return await asyncio.wrap_future(self.submit(call))

    def close(self) -> None:
        """Release the connections and threads this object holds (a later use opens new ones)."""
        with _making_threads:
            threads, self._threads = self._threads, None
        if threads is not None and threads[0] == os.getpid():
            threads[1].shutdown(wait=False)

    def _migrate(self, db: Any) -> None:
        """Bring the schema up to ``SCHEMA_VERSION`` inside the transaction ``db``, which holds the schema's lock."""
        db.execute("CREATE TABLE IF NOT EXISTS conductor_schema (version INTEGER NOT NULL)")
        version = db.execute("SELECT max(version) FROM conductor_schema").fetchone()[0] or 0
        if version > SCHEMA_VERSION:
            raise ConductorError(
                f"the database {self.name} has schema version {version}, newer than this dspy-conductor's "
                f"({SCHEMA_VERSION}): upgrade dspy-conductor on this machine to the version the others run"
            )
        for statements in _MIGRATIONS[self.dialect][version:]:
            for statement in statements:
                db.execute(statement)
        if version < SCHEMA_VERSION:
            db.execute("DELETE FROM conductor_schema")
            db.execute("INSERT INTO conductor_schema (version) VALUES (?)", (SCHEMA_VERSION,))


class SQLiteDatabase(Database):
    """A SQLite file, in write-ahead-logging mode (readers don't block writers); each transaction in ``BEGIN
    IMMEDIATE`` on a connection of its own. ``run`` has one thread: a file takes one writer at a time, and a second
    writer of the same process would wait in SQLite's busy handler, which sleeps in steps of up to 100 ms where a
    thread waiting in line is woken at once.

    Connections are kept for later transactions (one transaction at a time each), not opened per transaction: the
    last connection to a WAL file to close checkpoints the log into the database and deletes it, so a connection per
    transaction made every audit row a checkpoint (an audit write took 1.8 ms of CPU, and 0.5 on a kept connection).
    A connection whose transaction failed is closed, not kept; none is used by a process it was not opened in
    (SQLite's file locks belong to the process that opened it, so a forked child opens its own).
    """

    dialect = "sqlite"

    def __init__(self, path: str | Path, *, timeout_s: float = 30.0):
        self.path = Path(path).expanduser().absolute()
        self.name = str(self.path)
        self.timeout_s = timeout_s
        self._idle: list[sqlite3.Connection] = []
        self._idle_pid = os.getpid()  # the process the idle connections were opened in
        self._idle_lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._use_write_ahead_log()
            with self.transaction() as db:
                self._migrate(db)
        except (OSError, sqlite3.Error) as exc:
            raise ConductorError(f"can't open the database {self.path}: {exc}") from exc

    def _use_write_ahead_log(self) -> None:
        """Switch the file to WAL mode. While other processes open the same new file (``conductor serve --workers
        N`` starting), the switch can answer "database is locked" at once, without waiting in the busy handler as
        other statements do, so it is retried here until ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)) as db:
                    db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._connection()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except BaseException:
            db.close()
            raise
        with self._idle_lock:
            self._idle.append(db)

    def close(self) -> None:
        """Close the idle connections (a transaction still running closes or keeps its own when it ends)."""
        super().close()
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()

    def _connection(self) -> sqlite3.Connection:
        """An idle connection this process opened, or a new one (used by one thread at a time, not always the one
        that opened it)."""
        with self._idle_lock:
            if self._idle_pid != os.getpid():  # forked: the parent's connections are the parent's
                self._idle, self._idle_pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
        return sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)


class PostgresDatabase(Database):
    """A PostgreSQL database by URL, through a pool of at most ``max_connections`` connections (each checked before
    use, so a restarted database costs no failed request), as many as ``run`` has threads."""

    dialect = "postgresql"
    row_lock = " FOR UPDATE"

    def __init__(self, url: str, *, max_connections: int = DEFAULT_MAX_CONNECTIONS, timeout_s: float = 30.0):
        psycopg, psycopg_pool = _import_psycopg()
        self.name = safe_url(url)
        self.transactions_at_once = max_connections
        try:  # a direct connection first: its error says why (refused, no such database, authentication)
            with psycopg.connect(url, connect_timeout=int(timeout_s)) as db:
                db.execute("SELECT pg_advisory_xact_lock(hashtext('dspy-conductor schema'))")
                self._migrate(_Statements(db))
        except psycopg.Error as exc:
            raise ConductorError(f"can't open the database {self.name}: {exc}") from exc
        pool = psycopg_pool.ConnectionPool
        self._pool = pool(
            url, min_size=1, max_size=max_connections, timeout=timeout_s, check=pool.check_connection, open=True
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Statements]:
        with self._pool.connection() as db:  # the pool commits when the block ends, or rolls back on an error
            yield _Statements(db)

    def close(self) -> None:
        super().close()
        self._pool.close()


class _Statements:
    """A psycopg connection that takes ``?`` placeholders, as sqlite3 does (the project's SQL has no literal ``?``
    or ``%``)."""

    def __init__(self, connection: Any):
        self._connection = connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._connection.execute(sql.replace("?", "%s"), params or None)


def open_database(target: str | Path | Database, *, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> Database:
    """The database at ``target``: a SQLite file path (or ``sqlite:///path``), a ``postgresql://`` URL, or an open
    ``Database`` (returned as it is)."""
    if isinstance(target, Database):
        return target
    text = str(target)
    if text.startswith(POSTGRES_SCHEMES):
        return PostgresDatabase(text, max_connections=max_connections)
    if text.startswith("sqlite:///"):
        return SQLiteDatabase(text.removeprefix("sqlite:///"))
    if "://" in text:
        raise ConfigError(
            f"unsupported database {safe_url(text)}: give a SQLite file path (or sqlite:///path) or a "
            "postgresql://user@host/dbname URL"
        )
    return SQLiteDatabase(text)


def rows(cursor: Any) -> list[dict[str, Any]]:
    """A cursor's rows as dicts by column name (the same for sqlite3 and psycopg)."""
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def safe_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: fit for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _import_psycopg() -> tuple[ModuleType, ModuleType]:
    """psycopg and psycopg_pool, or ``MissingDependency`` naming the extra that installs them."""
    try:
        return importlib.import_module("psycopg"), importlib.import_module("psycopg_pool")
    except ImportError as exc:
        raise MissingDependency(
            f"a PostgreSQL database needs psycopg: pip install 'dspy-conductor[postgres]' ({exc})"
        ) from exc
