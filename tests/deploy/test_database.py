import asyncio
import multiprocessing
import sqlite3
import threading
import time

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


def test_database_work_runs_on_its_own_threads_when_the_loops_default_pool_is_busy(tmp_path):
    # DSPy's LM calls hop through the loop's default pool: audit writes waiting there for a lock held threads that
    # runs in flight queued for; the other way round, a busy pool must not hold up the database.
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    release = threading.Event()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        busy = [loop.run_in_executor(None, release.wait) for _ in range(64)]  # every default thread taken
        try:
            return await asyncio.wait_for(db.run(lambda: threading.current_thread().name), 10)
        finally:
            release.set()
            await asyncio.gather(*busy)

    assert asyncio.run(main()).startswith("conductor-db")


def test_a_sqlite_database_runs_one_transaction_at_a_time_in_order(tmp_path):
    # A second writer of the same process would only wait in SQLite's busy handler, which sleeps in steps of up to
    # 100 ms; in line on one thread, each starts as soon as the one before ends.
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    with db.transaction() as connection:
        connection.execute("CREATE TABLE t (n INTEGER)")
    inside, most_inside, lock = [0], [0], threading.Lock()

    def write(n: int) -> None:
        with lock:
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
        time.sleep(0.005)
        with db.transaction() as connection:
            connection.execute("INSERT INTO t VALUES (?)", (n,))
        with lock:
            inside[0] -= 1

    async def main() -> None:
        await asyncio.gather(*(db.run(lambda n=n: write(n)) for n in range(20)))

    asyncio.run(main())
    assert most_inside[0] == 1 and rows(db) == list(range(20))


def test_a_closed_database_runs_later_work_on_new_threads(tmp_path):
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    assert db.submit(lambda: 1).result(10) == 1
    db.close()
    assert db.submit(lambda: 2).result(10) == 2


def _run_in_child(db: SQLiteDatabase) -> None:
    with db.transaction() as connection:
        connection.execute("CREATE TABLE t (n INTEGER)")
    assert db.submit(lambda: rows(db)).result(10) == []  # its own thread: the parent's did not survive the fork


def test_a_forked_process_runs_database_work_on_threads_of_its_own(tmp_path):
    db = SQLiteDatabase(tmp_path / "db.sqlite")
    assert db.submit(lambda: 1).result(10) == 1  # the parent's thread exists before the fork
    child = multiprocessing.get_context("fork").Process(target=_run_in_child, args=(db,))
    child.start()
    child.join(30)
    assert child.exitcode == 0


def _open_at_once(path, ready, errors):
    ready.wait()
    try:
        SQLiteDatabase(path)
    except Exception as exc:  # reported to the parent, which asserts there were none
        errors.put(repr(exc))


def test_server_processes_opening_a_new_sqlite_file_at_once_all_open_it(tmp_path):
    """``conductor serve --workers N`` opens one new file from N processes at once. Switching it to WAL mode answered
    "database is locked" without waiting (12 of 40 rounds of 4 processes failed before the retry)."""
    fork = multiprocessing.get_context("fork")
    errors = fork.Queue()
    for round_ in range(20):
        ready = fork.Barrier(4)
        openers = [
            fork.Process(target=_open_at_once, args=(tmp_path / f"{round_}.sqlite", ready, errors)) for _ in range(4)
        ]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(60)
        assert [opener.exitcode for opener in openers] == [0] * 4
    assert errors.empty(), errors.get()
