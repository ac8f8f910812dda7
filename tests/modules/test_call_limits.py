"""API workers' calls overlap, within each worker's concurrency and rate limits; DSPy's cache answers repeats free."""

import asyncio
import contextlib
import time
import uuid

import dspy
import pytest

from conductor import ConfigError
from conductor.modules import Executor, LMWorker, Price, WorkerPool, Workflow
from conductor.modules.workers import CallLimits
from conductor.signatures import BUILTIN_ROLES, role_name
from conductor.testing import openai_stub

LATENCY = 0.2


@pytest.fixture(scope="module", autouse=True)
def warm_litellm():
    """litellm's first call and token count in a process take seconds (imports, client and tokenizer set-up): make
    them before the timed tests."""
    with openai_stub(0.0) as stub:
        run_side_by_side(api_worker(stub), 1)


def api_worker(stub, **limits) -> LMWorker:
    lm = dspy.LM("openai/stub", api_base=stub.api_base, api_key="x", cache=False, num_retries=0)
    return LMWorker("api", lm, price=Price(1.0, 1.0), **limits)


def run_side_by_side(worker: LMWorker, steps: int) -> float:
    """Run ``steps`` independent steps on ``worker`` in one workflow; the wall time."""
    roles = {role_name(role): dspy.Predict(role) for role in BUILTIN_ROLES}
    executor = Executor(WorkerPool([worker]), roles, max_parallel=steps)
    workflow = Workflow.from_lists([0] * steps, [f"part {i}" for i in range(steps)], [[]] * steps)
    started = time.perf_counter()
    result = executor.run(workflow, f"question {uuid.uuid4()}")
    assert result.error is None, result.error
    return time.perf_counter() - started


def test_calls_of_one_api_worker_run_side_by_side():
    with openai_stub(LATENCY) as stub:
        elapsed = run_side_by_side(api_worker(stub), 4)
    assert stub.requests == 4 and stub.most_in_flight == 4
    assert elapsed < 3 * LATENCY  # together, not one after another (4 x 0.2 s)


def test_max_concurrency_caps_the_calls_in_flight():
    with openai_stub(LATENCY) as stub:
        elapsed = run_side_by_side(api_worker(stub, max_concurrency=2), 4)
    assert stub.requests == 4 and stub.most_in_flight == 2
    assert elapsed >= 2 * LATENCY


def test_requests_per_minute_spaces_the_call_starts():
    with openai_stub(0.0) as stub:
        run_side_by_side(api_worker(stub, requests_per_minute=300), 4)  # one start every 0.2 s
    # the limiter spaces the starts; the stub sees arrivals, each later by the client's own latency, which under a
    # loaded machine delayed one call by a whole spacing (two arrivals 4 ms apart): so the four are asked to span at
    # least half their three spacings (unlimited, they arrive within milliseconds of each other)
    assert len(stub.starts) == 4 and stub.starts[-1] - stub.starts[0] >= 0.3


def test_a_turn_at_the_limit_is_waited_for_without_blocking_the_event_loop():
    limits, entered = CallLimits(max_concurrency=1), []

    async def call(name: str, hold_s: float) -> None:
        async with limits.turn():
            entered.append(name)
            await asyncio.sleep(hold_s)

    async def main() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await asyncio.gather(call("first", 0.3), call("second", 0.0))
        ticker.cancel()
        return ticks

    assert asyncio.run(main()) >= 15 and entered == ["first", "second"]  # the loop ran on while "second" waited


def test_a_cancelled_wait_for_a_turn_gives_back_the_slot_it_gets_later():
    limits = CallLimits(max_concurrency=1)

    async def take_a_turn() -> None:
        async with limits.turn():
            pass

    async def main() -> None:
        async with limits.turn():
            waiting = asyncio.create_task(take_a_turn())
            await asyncio.sleep(0.05)  # it waits for the slot on a daemon thread
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        async with asyncio.timeout(2):  # the thread got the slot as it was freed, and gave it back
            await take_a_turn()

    asyncio.run(main())


def test_dspy_s_cache_answers_a_repeated_call_at_no_cost(monkeypatch):
    monkeypatch.setenv("STUB_KEY", "x")
    question = f"what is {uuid.uuid4()}?"  # DSPy's cache lives on disk: a fresh call each test run
    with openai_stub(0.0) as stub:
        spec = {
            "name": "api",
            "kind": "lm",
            "model": "openai/stub",
            "api_base": stub.api_base,
            "api_key_env": "STUB_KEY",
            "price": {"input_per_1k": 1.0, "output_per_1k": 1.0},
        }
        for cache, calls, costs in ((True, 1, [None, 0.0]), (False, 2, [None, None])):
            (worker,) = WorkerPool.from_config({"workers": [spec | {"cache": cache}]})
            before = stub.requests
            messages = [{"role": "user", "content": f"{question} cache={cache}"}]
            got = [worker.complete(messages, max_tokens=8, temperature=0.0).cost for _ in range(2)]
            assert stub.requests - before == calls and got == costs


@pytest.mark.parametrize("limits", [{"max_concurrency": 0}, {"requests_per_minute": 0}, {"requests_per_minute": -1}])
def test_limits_that_allow_no_call_are_refused(limits):
    with pytest.raises(ConfigError):
        LMWorker("api", dspy.LM("openai/stub"), price=Price(), **limits)
    spec = {"name": "api", "kind": "lm", "model": "openai/stub", "price": {"input_per_1k": 0, "output_per_1k": 0}}
    with pytest.raises(ConfigError):
        WorkerPool.from_config({"workers": [spec | limits]})
