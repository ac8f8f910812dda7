"""A served program over API models runs its requests on the event loop: many at once take about one run's time and
hold no thread each, and a request still waiting for a run slot at its timeout gets a 504 and its audit row at once."""

import asyncio
import time

import pytest

pytest.importorskip("fastapi")
import httpx

from conductor.deploy import AuditLog, create_app
from tests.modules.async_stub import async_openai_stub
from tests.modules.test_async_path import DSPY_HOP_THREADS, LATENCY_S, api_program, timed_with_threads


@pytest.fixture(scope="module")
def stub():
    with async_openai_stub(LATENCY_S) as stub:
        yield stub


async def ask(client: httpx.AsyncClient, request_id: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": f"Question {request_id}"}]}
    return await client.post("/v1/chat/completions", json=body, headers={"x-request-id": request_id})


def served(app, requests: int):
    """Send ``requests`` chat requests to ``app`` at once, in process: the responses, the seconds they took and the
    most threads that ran meanwhile beyond those before (see ``timed_with_threads``)."""

    async def send_all():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as client:
            return await asyncio.gather(*(ask(client, f"r{i}") for i in range(requests)))

    return asyncio.run(timed_with_threads(send_all))


def test_requests_below_the_concurrency_take_about_one_run_s_time_and_hold_no_thread(stub):
    app = create_app(api_program(stub), model="team", concurrency=32)
    served(app, 1)  # litellm's and DSPy's first calls in a process set up clients and tables
    _, one_s, _ = served(app, 1)
    responses, twenty_s, extra_threads = served(app, 20)
    assert [r.status_code for r in responses] == [200] * 20
    assert one_s >= 3 * LATENCY_S and twenty_s < 6 * one_s  # side by side (in turn: 20 times); margin for load
    assert extra_threads <= DSPY_HOP_THREADS  # not a thread per request or per call


def test_a_request_waiting_for_a_run_slot_past_its_timeout_gets_a_504_and_its_row_at_once(stub, tmp_path):
    db = tmp_path / "audit.sqlite"
    timeout_s = 2 * LATENCY_S  # the run takes three calls: its client gives up during the second
    app = create_app(api_program(stub), model="team", concurrency=1, request_timeout_s=timeout_s, audit_db=db)

    async def two_requests():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as client:
            running = asyncio.create_task(ask(client, "running"))
            await asyncio.sleep(0.1)  # the first holds the only run slot
            responses = await asyncio.gather(running, ask(client, "waiting"))
            rows = {row["request_id"]: row for row in AuditLog(db).read()}
            deadline = time.monotonic() + 5 * LATENCY_S
            while "running" not in {row["request_id"] for row in AuditLog(db).read()}:  # the run goes on
                assert time.monotonic() < deadline, "the run that outlived its client left no row"
                await asyncio.sleep(0.05)
            return responses, rows

    before = stub.requests
    responses, rows_at_the_504s = asyncio.run(two_requests())
    assert [r.status_code for r in responses] == [504, 504]
    assert list(rows_at_the_504s) == ["waiting"]  # written at once; the running one's when its run ends
    waited, ran = (
        next(row for row in AuditLog(db).read() if row["request_id"] == name) for name in ("waiting", "running")
    )
    assert waited["outcome"] == ran["outcome"] == "timeout" and waited["workers"] == [] and waited["cost"] == 0
    assert ran["workers"] == ["api", "api"] and ran["latency_s"] >= 3 * LATENCY_S
    assert stub.requests - before == 3 and len(AuditLog(db).read()) == 2  # the waiting one never ran
