"""The reusable daemon threads, and sync code running a coroutine (``conductor.modules._threads``)."""

import asyncio
import contextvars
import threading

import pytest

from conductor.modules import _threads


def call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "conductor-call"]


def test_calls_one_after_another_reuse_a_thread_and_see_the_caller_s_context():
    seen = contextvars.ContextVar("seen", default="unset")
    seen.set("the caller's")
    before = len(call_threads())  # other tests' threads may still wait for a call
    for _ in range(50):
        assert _threads.submit(seen.get).result(timeout=5) == "the caller's"
    assert all(t.daemon for t in call_threads())
    assert len(call_threads()) <= before + 1


def test_a_hung_call_keeps_its_thread_and_the_others_go_on():
    release = threading.Event()
    hung = _threads.submit(release.wait)
    try:
        assert [_threads.submit(lambda i=i: i * i).result(timeout=5) for i in range(5)] == [0, 1, 4, 9, 16]
        assert not hung.done()
    finally:
        release.set()
    assert hung.result(timeout=5) is True


def test_an_error_reaches_the_caller():
    def fail():
        raise KeyError("no such worker")

    with pytest.raises(KeyError, match="no such worker"):
        _threads.submit(fail).result(timeout=5)


def test_an_idle_thread_ends(monkeypatch):
    monkeypatch.setattr(_threads, "IDLE_EXIT_S", 0.05)
    busy = len(call_threads()) - _threads._unclaimed  # calls other tests left hanging keep their threads
    calls = _threads._unclaimed + 3  # more at once than threads wait: new ones start
    barrier = threading.Barrier(calls + 1)
    futures = [_threads.submit(lambda: barrier.wait(5)) for _ in range(calls)]
    barrier.wait(5)
    for future in futures:
        future.result(timeout=5)
    assert len(call_threads()) >= calls
    threading.Event().wait(0.5)  # every one of them waits for its next call under the short idle limit
    assert len(call_threads()) <= busy


def test_run_sync_keeps_one_loop_per_thread_and_runs_in_a_copy_of_the_caller_s_context():
    seen = contextvars.ContextVar("seen", default="unset")
    seen.set("the caller's")

    async def look() -> tuple[asyncio.AbstractEventLoop, str]:
        value = seen.get()
        seen.set("the coroutine's")
        return asyncio.get_running_loop(), value

    (first_loop, first), (second_loop, second) = _threads.run_sync(look()), _threads.run_sync(look())
    assert first_loop is second_loop and first == second == "the caller's" and seen.get() == "the caller's"


def test_run_sync_raises_the_coroutine_s_error():
    async def fail():
        raise KeyError("no such step")

    with pytest.raises(KeyError, match="no such step"):
        _threads.run_sync(fail())
