import multiprocessing
import sqlite3

import pytest

from conductor.deploy._database import SQLiteDatabase


@pytest.fixture
def opened(monkeypatch):
    """Every SQLite connection opened from now on."""
    connections = []
    connect = sqlite3.connect

    def counted(*args, **kwargs):
        connections.append(connect(*args, **kwargs))
        return connections[-1]

    monkeypatch.setattr(sqlite3, "connect", counted)
    return connections


def rows(db: SQLiteDatabase) -> list[int]:
    with db.transaction() as connection:
        return [row[0] for row in connection.execute("SELECT n FROM t ORDER BY n")]


def test_sqlite_transactions_keep_their_connection_for_the_next(tmp_path, opened):
    # A connection per transaction made every write a WAL checkpoint: most of an audit row's CPU.
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    opened.clear()  # those that set the file up
    with db.transaction() as connection:
        connection.execute("CREATE TABLE t (n INTEGER)")
    for n in range(3):
        with db.transaction() as connection:
            connection.execute("INSERT INTO t VALUES (?)", (n,))
    assert rows(db) == [0, 1, 2] and len(opened) <= 1  # five transactions, one after another, on one connection
    assert rows(SQLiteDatabase(tmp_path / "db.sqlite")) == [0, 1, 2]  # committed for every other connection


def test_a_failed_sqlite_transaction_is_rolled_back_and_its_connection_not_kept(tmp_path, opened):
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    with db.transaction() as connection:
        connection.execute("CREATE TABLE t (n INTEGER)")
    opened.clear()
    with pytest.raises(RuntimeError), db.transaction() as connection:
        connection.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("the caller's error")
    assert rows(db) == [] and len(opened) == 1  # a fresh connection after the failure, with nothing of it
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        connection.execute("SELECT 1")


def test_closing_a_sqlite_database_closes_its_idle_connections_and_a_later_transaction_opens_one(tmp_path):
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    with db.transaction() as connection:
        connection.execute("CREATE TABLE t (n INTEGER)")
    db.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        connection.execute("SELECT 1")
    assert rows(db) == []


def _write_in_child(db: SQLiteDatabase, opened: list[sqlite3.Connection]) -> None:
    before = len(opened)
    with db.transaction() as connection:
        connection.execute("INSERT INTO t VALUES (2)")
    assert len(opened) == before + 1  # its own connection, not one of its parent's


def test_a_forked_process_opens_its_own_sqlite_connection(tmp_path, opened):
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    with db.transaction() as connection:
        connection.execute("CREATE TABLE t (n INTEGER)")
        connection.execute("INSERT INTO t VALUES (1)")
    child = multiprocessing.get_context("fork").Process(target=_write_in_child, args=(db, opened))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and rows(db) == [1, 2]
