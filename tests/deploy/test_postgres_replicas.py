"""Replicas behind a load balancer, stood in for by server processes on one PostgreSQL database: a key's daily limit
holds across them, every request is audited once, a replica killed mid-run loses no finished request's row, and a
key revoked through one is refused by the others at once."""

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conductor.cli import main
from conductor.deploy import AuditLog, SpendLedger, StoredKeys, create_app
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.cli.test_serve_workers import free_port
from tests.deploy.postgres import new_database
from tests.deploy.test_governance import ONE_STEP, PricedWorker, key_entry

pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]
DB_ENV, DELAY_ENV = "CONDUCTOR_TEST_REPLICA_DB", "CONDUCTOR_TEST_REPLICA_DELAY_S"


def replica_app():
    """One replica's app (uvicorn's factory): the solver's provider reports $0.001 a call, after a delay."""
    solver = PricedWorker("solver", 0.001, retries=0, delay_s=float(os.environ[DELAY_ENV]))
    program = Conductor(WorkerPool([ScriptedWorker("planner", retries=0), solver]), scripted_lm(lambda _: ONE_STEP))
    return create_app(program, model="team", audit_db=os.environ[DB_ENV])


class Replica:
    """A server process on ``db``, its solver taking ``delay_s`` a call."""

    def __init__(self, db: str, delay_s: float):
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [sys.executable, "-m", "uvicorn", "--factory", "tests.deploy.test_postgres_replicas:replica_app"]
        command += ["--port", self.url.rsplit(":", 1)[1], "--log-level", "warning"]
        env = os.environ | {"PYTHONPATH": str(ROOT), DB_ENV: db, DELAY_ENV: str(delay_s)}
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE)

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None, self.process.stderr.read().decode()
            try:
                if httpx.get(f"{self.url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the replica did not start"
            time.sleep(0.3)

    def ask(self, key: str, request_id: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}", "x-request-id": request_id or uuid.uuid4().hex}
        body = {"messages": [{"role": "user", "content": "Say the number 7."}]}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@pytest.fixture(scope="module")
def database(postgres_cluster) -> Iterator[tuple[str, dict[str, str]]]:
    """A database with the keys of this module's tests (stored before the replicas start, which then need keys)."""
    url = new_database(postgres_cluster)
    keys, stored = {}, StoredKeys(url)
    for key_id, limits in {
        "team": {"budget": Budget(max_cost=0.001), "daily_cost": 0.010},
        "temp": {},
        "crash": {"budget": Budget(max_cost=0.001), "daily_cost": 1.0},
    }.items():
        keys[key_id], spec = key_entry(key_id, **limits)
        stored.add(spec)
    stored.close()
    yield url, keys


@pytest.fixture(scope="module")
def replicas(database) -> Iterator[list[Replica]]:
    """Three replicas on the module's database."""
    started = [Replica(database[0], delay_s=0.05) for _ in range(3)]
    try:
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            replica.stop()


def test_racing_requests_on_three_replicas_never_overspend_and_each_is_audited_once(database, replicas):
    url, keys = database
    request_ids = [f"race-{i}" for i in range(60)]
    with ThreadPoolExecutor(24) as threads:
        responses = list(threads.map(lambda i: replicas[i % 3].ask(keys["team"], request_ids[i]), range(60)))
    assert Counter(r.status_code for r in responses) == {200: 10, 429: 50}
    answered_by = Counter(i % 3 for i, r in enumerate(responses) if r.status_code == 200)
    assert len(answered_by) > 1  # the limit was shared, not met by one replica alone
    ledger = SpendLedger(url)
    day = ledger.day("team")
    assert day.requests == 10 and day.spent_cost == pytest.approx(0.010) and day.held_cost == 0
    rows = [row for row in AuditLog(ledger.database).read() if row["key_id"] == "team"]
    assert Counter(row["request_id"] for row in rows) == Counter(request_ids)  # every request, exactly once
    assert Counter(row["outcome"] for row in rows) == {"ok": 10, "rate-limited": 50}
    ledger.database.close()


def test_a_key_revoked_through_one_replica_is_refused_by_another_at_once(database, replicas):
    url, keys = database
    assert replicas[1].ask(keys["temp"]).status_code == 200
    assert main(["keys", "revoke", "temp", "--db", url]) == 0
    refused = replicas[2].ask(keys["temp"])
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert replicas[0].ask(keys["temp"]).status_code == 401


def test_a_replica_killed_mid_run_loses_no_audit_row_of_a_finished_request(database):
    url, keys = database
    replica = Replica(url, delay_s=1.0)
    try:
        replica.wait_ready()
        finished = [f"done-{i}" for i in range(3)]
        assert [replica.ask(keys["crash"], request_id).status_code for request_id in finished] == [200] * 3
        with ThreadPoolExecutor(1) as thread:
            in_flight = thread.submit(replica.ask, keys["crash"], "cut-short")
            ledger = SpendLedger(url)
            deadline = time.monotonic() + 30
            while ledger.day("crash").held_cost == 0:  # its reservation is made: the run has begun
                assert time.monotonic() < deadline, "the last request never started"
                time.sleep(0.05)
            replica.process.send_signal(signal.SIGKILL)
            with pytest.raises(httpx.TransportError):
                in_flight.result()
    finally:
        replica.stop()
    rows = [row for row in AuditLog(ledger.database).read() if row["key_id"] == "crash"]
    assert [(row["request_id"], row["outcome"]) for row in rows] == [(request_id, "ok") for request_id in finished]
    day = ledger.day("crash")  # the killed run's reservation stays held: erring toward refusing, never overspending
    assert day.requests == 3 and day.held_cost == pytest.approx(0.001)
    ledger.database.close()
