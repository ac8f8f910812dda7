"""Every chat request leaves exactly one audit row whose outcome is what its client got: answered, refused, cut short
by a timeout or a disconnect, or failed; and a database that can't be written gives a 503 that keeps the charge, never
a 500 or half a record."""

import asyncio
import json
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.deploy import AuditLog, KeySpec, KeyStore, SpendLedger, create_app, hash_key, new_key
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.test_governance import TWO_STEPS, PricedWorker

SLOW_S = 1.0
TIMEOUT_S = 0.4
SOLVER_COST = 0.001


class Solver(PricedWorker):
    """The solver, whose provider reports ``SOLVER_COST`` a call: slow when the question asks, so its client times
    out."""

    def complete(self, messages, *, max_tokens, temperature):
        if "slowly" in messages[-1]["content"]:
            time.sleep(SLOW_S)
        return super().complete(messages, max_tokens=max_tokens, temperature=temperature)


def program() -> Conductor:
    """A planner and a priced solver; the question picks a failure: the conductor LM down (502), an unusable
    workflow (answered, outcome ``format``), a bug in the library (500)."""

    def conductor(prompt: str) -> str:
        if "conductor down" in prompt:
            raise RuntimeError("the conductor is down")
        return "no lists" if "unusable" in prompt else TWO_STEPS

    pool = WorkerPool([ScriptedWorker("planner", lambda _: "1. look"), Solver("solver", SOLVER_COST)])
    served = Conductor(pool, scripted_lm(conductor), fallback="none")
    run_reply = served.arun_reply

    async def run_reply_with_a_bug(question, *args, **kwargs):
        if "a bug" in question:
            raise ZeroDivisionError("division by zero")
        return await run_reply(question, *args, **kwargs)

    served.arun_reply = run_reply_with_a_bug
    return served


KEYS = {name: new_key() for name in ("alice", "reader", "broke")}
SPECS = [
    KeySpec(id="alice", hash=hash_key(KEYS["alice"])),
    KeySpec(id="reader", hash=hash_key(KEYS["reader"]), workers=("planner",)),  # the workflow calls the solver too
    KeySpec(id="broke", hash=hash_key(KEYS["broke"]), budget=Budget(max_tokens=1_000), daily_tokens=999),
]


@pytest.fixture
def served(tmp_path):
    """``start(**options)``: a keyed server with an audit log and a spend ledger in one file; it gives the client and
    the file."""
    db, clients = tmp_path / "audit.sqlite", []

    def start(served_program: Conductor | None = None, **options):
        options = {"request_timeout_s": TIMEOUT_S, "max_request_bytes": 4_000} | options
        app = create_app(served_program or program(), model="team", keys=KeyStore(SPECS), audit_db=db, **options)
        clients.append(TestClient(app, raise_server_exceptions=False).__enter__())
        return clients[-1], db

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def post(client: TestClient, request_id: str, key: str | None = "alice", body: bytes | None = None, **fields):
    question = fields.pop("question", "Say the number 7.")
    body = body or json.dumps({"messages": [{"role": "user", "content": question}], **fields}).encode()
    headers = {"x-request-id": request_id, "content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {KEYS[key]}"
    return client.post("/v1/chat/completions", content=body, headers=headers)


def rows_of(db, request_id: str, *, wait_s: float = 0.0) -> list[dict]:
    """The audit rows of ``request_id``, waiting up to ``wait_s`` for one that is written when its run ends."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = [row for row in AuditLog(db).read() if row["request_id"] == request_id]
        if rows or time.monotonic() >= deadline:
            return rows
        time.sleep(0.05)


REQUESTS = [  # (name, how it is sent, the status its client gets, the outcome its row holds)
    ("an answer", {}, 200, "ok"),
    ("a streamed answer", {"stream": True}, 200, "ok"),
    ("an unusable workflow", {"question": "Say the number 7, unusable."}, 200, "format"),
    ("no key", {"key": None}, 401, "unauthorized"),
    ("a workflow calling a worker the key may not use", {"key": "reader"}, 403, "forbidden"),
    ("a key past its daily tokens", {"key": "broke"}, 429, "rate-limited"),
    ("not JSON", {"body": b"{nope"}, 400, "input"),
    ("JSON nested 500 objects deep", {"body": b'{"metadata": ' + b'{"a":' * 500 + b"1" + b"}" * 501}, 400, "input"),
    ("max_tokens of 2**63", {"max_tokens": 2**63}, 400, "input"),
    ("a max_cost of 1e300", {"conductor_budget": {"max_cost": 1e300}}, 400, "input"),
    ("a budget too small to answer", {"conductor_budget": {"max_steps": 1}}, 400, "budget"),
    ("another model", {"model": "gpt-4o"}, 404, "input"),
    ("a body over the limit", {"question": "x" * 5_000}, 413, "input"),
    ("a failing conductor LM", {"question": "conductor down"}, 502, "error"),
    ("a bug in the library", {"question": "a bug"}, 500, "error"),
    ("a run that outlives its client", {"question": "Say the number 7 slowly."}, 504, "timeout"),
]


@pytest.mark.parametrize("how, status, outcome", [pytest.param(*case[1:], id=case[0]) for case in REQUESTS])
def test_each_request_leaves_one_row_whose_outcome_is_what_its_client_got(served, how, status, outcome):
    client, db = served()
    response = post(client, "the-request", **how)
    assert response.status_code == status, response.text
    [row] = rows_of(db, "the-request", wait_s=3 * SLOW_S)
    assert row["outcome"] == outcome and (row["error"] is None) == (outcome == "ok")
    time.sleep(0.1)  # a second row would be written by now
    assert len(AuditLog(db).read()) == 1
    held = SpendLedger(db).day(how.get("key") or "alice")
    assert held.held_cost == held.held_tokens == 0  # nothing left reserved, whatever happened


def test_a_run_that_times_out_is_recorded_with_its_cost_and_one_still_waiting_is_never_run(served):
    served_program = program()
    client, db = served(served_program, concurrency=1)
    with ThreadPoolExecutor(2) as clients:
        running = clients.submit(post, client, "running", question="Say the number 7 slowly.")
        time.sleep(0.1)  # the first holds the only run thread
        waiting = clients.submit(post, client, "waiting", question="Say the number 8 slowly.")
        assert [running.result().status_code, waiting.result().status_code] == [504, 504]
    [waited] = rows_of(db, "waiting")  # never started: recorded at once
    [ran] = rows_of(db, "running", wait_s=3 * SLOW_S)  # recorded when its run ended
    assert waited["outcome"] == ran["outcome"] == "timeout" and "no answer within 0.4 s" in ran["error"]
    assert waited["workers"] == [] and waited["cost"] == 0
    assert ran["workers"] == ["planner", "solver"] and ran["cost"] == pytest.approx(SOLVER_COST)
    assert ran["latency_s"] >= SLOW_S
    assert served_program.pool[1].calls == 1
    day = SpendLedger(db).day("alice")
    assert day.requests == 1 and day.spent_cost == pytest.approx(SOLVER_COST) and day.held_cost == 0
    assert len(AuditLog(db).read()) == 2


# ---- a client cut off mid-upload, driven at the ASGI level -----------------------------------------------------
def call(app, messages: list[dict], headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """POST /v1/chat/completions to ``app`` as a client that sends ``messages`` (ASGI ``http.request`` and
    ``http.disconnect`` events) and then nothing more; its status and JSON body."""
    sent = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a client that has gone quiet

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    asyncio.run(app(scope, receive, send))
    [start] = [message for message in sent if message["type"] == "http.response.start"]
    return start["status"], json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


def part(body: bytes, *, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_client_gone_mid_upload_is_recorded_as_disconnected_without_an_error_log(tmp_path, caplog):
    db = tmp_path / "audit.sqlite"
    app = create_app(program(), model="team", audit_db=db)
    upload = [part(b'{"messages": [', more=True), {"type": "http.disconnect"}]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status, _ = call(app, upload, [(b"x-request-id", b"gone")])
    assert status == 499
    [row] = AuditLog(db).read()
    assert (row["request_id"], row["outcome"]) == ("gone", "disconnected") and "disconnected" in row["error"]
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_a_body_that_does_not_arrive_in_time_gets_a_408_and_a_row(tmp_path):
    db = tmp_path / "audit.sqlite"
    app = create_app(program(), model="team", audit_db=db, body_timeout_s=0.2)
    started = time.perf_counter()
    status, body = call(app, [part(b'{"messages": [', more=True)], [(b"x-request-id", b"slow")])
    assert status == 408 and body["error"]["code"] == "request_timeout" and "0.2 s" in body["error"]["message"]
    assert time.perf_counter() - started < 5
    [row] = AuditLog(db).read()
    assert (row["request_id"], row["outcome"]) == ("slow", "timeout")


# ---- a database that can't be written ----------------------------------------------------------------------------
def fail_writes(db, statement: str, message: str) -> None:
    """Make SQLite refuse every ``statement`` (``INSERT ON audit``, ...), as a full or locked database does."""
    with sqlite3.connect(db) as connection:
        connection.execute(f"CREATE TRIGGER fail BEFORE {statement} BEGIN SELECT RAISE(ABORT, '{message}'); END")


def test_an_audit_log_that_cannot_be_written_gives_a_503_keeps_the_charge_and_writes_nothing(served, caplog):
    client, db = served()
    fail_writes(db, "INSERT ON audit", "database or disk is full")
    answered, refused = post(client, "answered"), post(client, "refused", key=None)
    for response, request_id in ((answered, "answered"), (refused, "refused")):
        error = response.json()["error"]
        assert response.status_code == 503 and (error["code"], error["type"]) == ("storage_unavailable", "server_error")
        assert f"can't write the audit log (request {request_id}) now; try again later" in error["message"]
    assert float(answered.headers["x-conductor-cost-usd"]) == pytest.approx(SOLVER_COST)  # what the key is charged
    assert "x-conductor-cost-usd" not in refused.headers  # nothing ran
    assert AuditLog(db).read() == []  # no row, not half of one
    day = SpendLedger(db).day("alice")  # the answered request's run is charged to its key
    assert day.requests == 1 and day.spent_cost == pytest.approx(SOLVER_COST) and day.held_cost == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"can't write the audit log (request {request_id}): IntegrityError: database or disk is full"
        for request_id in ("answered", "refused")
    ]


def test_a_ledger_that_cannot_settle_gives_a_503_and_keeps_the_worst_case_held(served):
    client, db = served(budget=Budget(max_cost=0.5, max_tokens=2_000))
    fail_writes(db, "UPDATE OF requests ON daily_spend", "database is locked")  # settling counts the request
    response = post(client, "unsettled")
    assert response.status_code == 503 and response.json()["error"]["code"] == "storage_unavailable"
    assert "can't write the spend ledger" in response.json()["error"]["message"]
    day = SpendLedger(db).day("alice")  # the reservation stays: the day counts more than was spent, never less
    assert (day.held_cost, day.held_tokens, day.requests) == (pytest.approx(0.5), 2_000, 0)
    [row] = AuditLog(db).read()  # recorded with what the run spent
    assert row["outcome"] == "error" and row["cost"] == pytest.approx(SOLVER_COST) and row["workers"][-1] == "solver"
