"""The server's database in PostgreSQL, in one process: the audit log, the spend ledger, stored keys and the schema's
version. Several server processes on one database: ``test_postgres_replicas.py``."""

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from conductor.cli import _common, main
from conductor.deploy import (
    SCHEMA_VERSION,
    AuditEntry,
    AuditLog,
    SpendLedger,
    SpendLimitExceeded,
    StoredKeys,
    open_database,
)
from conductor.deploy._database import DEFAULT_MAX_CONNECTIONS
from conductor.deploy.server._spend import open_stores
from conductor.errors import ConductorError, ConfigError
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.test_governance import key_entry

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setattr(_common.status, "width", 300)
    monkeypatch.setattr(_common.console, "width", 300)


def test_the_audit_log_in_postgres_is_append_only_and_stores_any_text(postgres_url):
    log = AuditLog(postgres_url, store_questions=True)
    log.write(AuditEntry("req-1", "team", "ok", key_id="alice", cost=0.5, question="a NUL\x00 here"))
    with psycopg.connect(postgres_url, autocommit=True) as db:
        for statement in ("UPDATE audit SET cost = 0", "DELETE FROM audit", "TRUNCATE audit"):
            with pytest.raises(psycopg.errors.RaiseException, match="the audit log is append-only"):
                db.execute(statement)
    [record] = log.read()
    assert (record["request_id"], record["cost"], record["question"]) == ("req-1", 0.5, "a NUL\\x00 here")
    log.database.close()


def test_racing_reservations_in_postgres_fill_a_daily_limit_exactly(postgres_url):
    ledger = SpendLedger(postgres_url)
    _, spec = key_entry("team", budget=Budget(max_cost=0.001), daily_cost=0.010)

    def reserve(_):
        try:
            return ledger.reserve(spec, spec.budget)
        except SpendLimitExceeded:
            return None

    with ThreadPoolExecutor(16) as threads:
        held = [reservation for reservation in threads.map(reserve, range(40)) if reservation is not None]
    assert len(held) == 10 and ledger.day("team").held_cost == pytest.approx(0.010)
    for reservation in held:
        ledger.settle(reservation, cost=0.001, tokens=5)
    day = ledger.day("team")
    assert (day.requests, day.spent_tokens, day.held_cost) == (10, 50, 0)
    assert day.spent_cost == pytest.approx(0.010)
    ledger.database.close()


def test_stored_keys_are_found_by_hash_until_revoked(postgres_url):
    keys = StoredKeys(postgres_url)
    key, spec = key_entry("alice", workers=("solver",), budget=Budget(max_cost=0.1), daily_cost=1.0)
    assert not keys.any_added()
    keys.add(spec)
    assert keys.authenticate(key) == spec and keys.authenticate(key + "x") is None
    assert keys.keys == (spec,) and keys.has_daily_limits
    with pytest.raises(ConfigError, match="the key id 'alice' is already in"):
        keys.add(key_entry("alice")[1])
    keys.revoke("alice")
    assert keys.authenticate(key) is None and keys.keys == () and keys.any_added()
    [entry] = keys.entries()
    assert entry.spec == spec and entry.revoked is not None
    with pytest.raises(ConfigError, match=r"no key 'alice' in use .*; the keys in use: \[\]"):
        keys.revoke("alice")
    keys.close()


def test_keys_add_list_and_revoke_through_the_cli(postgres_url, capsys, wide):
    assert main(["keys", "add", "--db", postgres_url, "--id", "ops", "--max-cost", "0.01", "--daily-cost", "1"]) == 0
    key = capsys.readouterr().out.strip()
    assert main(["keys", "add", "--db", postgres_url, "--id", "bad", "--daily-tokens", "9"]) == 2
    assert "needs budget.max_tokens" in capsys.readouterr().err
    assert main(["keys", "list", "--db", postgres_url]) == 0
    listing = capsys.readouterr().out
    assert "ops" in listing and "$0.01" in listing and "$1" in listing and key not in listing and "bad" not in listing
    assert main(["keys", "revoke", "ops", "--db", postgres_url]) == 0
    assert "refuses it now" in capsys.readouterr().err
    keys = StoredKeys(postgres_url)
    assert keys.authenticate(key) is None and [entry.spec.id for entry in keys.entries()] == ["ops"]
    keys.close()


def test_a_keys_file_can_be_listed_and_revoked_too(tmp_path, capsys, wide):
    path = tmp_path / "keys.yaml"
    for name in ("alice", "bob"):
        assert main(["keys", "add", "--file", str(path), "--id", name, "--workers", "calc"]) == 0
    assert main(["keys", "revoke", "alice", "--file", str(path)]) == 0
    assert main(["keys", "list", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bob" in out and "calc" in out and "alice" not in out
    assert main(["keys", "revoke", "alice", "--file", str(path)]) == 2
    assert "no key 'alice'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_database_of_a_newer_schema_is_refused(kind, tmp_path, request):
    url = str(tmp_path / "audit.sqlite") if kind == "sqlite" else request.getfixturevalue("postgres_url")
    open_database(url).close()
    if kind == "sqlite":
        with sqlite3.connect(url) as db:
            db.execute("UPDATE conductor_schema SET version = ?", (SCHEMA_VERSION + 1,))
    else:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("UPDATE conductor_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(ConductorError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this dspy-conductor"):
        open_database(url)


def test_a_sqlite_file_from_before_schema_versions_is_brought_up_to_date(tmp_path):
    path = tmp_path / "audit.sqlite"
    with sqlite3.connect(path) as db:  # what the library wrote before its schema had a version
        db.execute(
            "CREATE TABLE daily_spend (key_id TEXT NOT NULL, day TEXT NOT NULL, requests INTEGER NOT NULL "
            "DEFAULT 0, spent_nanodollars INTEGER NOT NULL DEFAULT 0, spent_tokens INTEGER NOT NULL DEFAULT 0, "
            "held_nanodollars INTEGER NOT NULL DEFAULT 0, held_tokens INTEGER NOT NULL DEFAULT 0, "
            "PRIMARY KEY (key_id, day))"
        )
        db.execute("INSERT INTO daily_spend (key_id, day, requests) VALUES ('alice', '2025-03-01', 3)")
    ledger = SpendLedger(path)
    assert ledger.day("alice", "2025-03-01").requests == 3
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version FROM conductor_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_a_bad_database_url_says_what_is_wrong(postgres_cluster):
    with pytest.raises(ConfigError, match=r"unsupported database mysql://root:\*\*\*@db/x"):
        open_database("mysql://root:hunter2@db/x")
    missing = postgres_cluster.replace("/postgres?", "/no_such_database?")
    with pytest.raises(ConductorError, match=r"can.t open the database .*no_such_database.*does not exist"):
        open_database(missing)


def test_a_server_holds_at_most_16_connections_to_postgres_whatever_its_concurrency(postgres_url):
    # Runs in flight hold no connection: a request's transactions take milliseconds, each on one of the database's
    # threads, so --concurrency 1024 must not mean 1,024 connections per replica (PostgreSQL's default limit is 100).
    program = Conductor(WorkerPool([ScriptedWorker("echo", lambda prompt: "42")]), scripted_lm(lambda _: ""))
    for concurrency, connections in ((4, 4), (1024, DEFAULT_MAX_CONNECTIONS)):
        stores = open_stores(program, None, postgres_url, False, (), concurrency)
        try:
            assert stores.database.transactions_at_once == connections
        finally:
            stores.close()
