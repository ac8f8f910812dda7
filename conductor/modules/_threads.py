"""Where blocking code runs beside the event loop, and how sync code runs a coroutine.

``submit`` runs a call on a reused daemon thread: what a blocking worker call (an in-process model, a tool, a DSPy
module) and an in-process conductor LM run on, so the event loop goes on meanwhile and a hung call can be abandoned
after its timeout; and where a worker at its concurrency limit waits for a slot. API workers' calls take no thread.
A ``ThreadPoolExecutor`` (``asyncio.to_thread``'s pool) doesn't fit: its pool is bounded (hung calls would use it up)
and its threads are joined at interpreter exit (one hung call would keep the process alive). Starting a fresh daemon
thread per call did fit, and was a sixth of a served request's CPU time.

``run_sync`` is how the sync entry points (``Executor.run``, ``Conductor.forward``, ...) run the async core they share
with the async ones. It sits below the rooms of ``conductor.modules`` because workers, the executor and the programs
all use this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

IDLE_EXIT_S = 60.0
"""How long a thread waits for the next call before it ends."""

_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_lock = threading.Lock()
_unclaimed = 0  # threads waiting for a job that no submitted job has counted on yet
_loops = threading.local()  # each thread's own event loop for run_sync, made on its first call


def submit(call: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Run ``call`` on a waiting daemon thread (a new one when none waits), in a copy of the caller's context so
    ``dspy.context`` settings and the current span reach it. A call that never returns keeps its thread; the rest
    go on."""
    global _unclaimed
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    context = contextvars.copy_context()

    def job() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(call))
        except BaseException as exc:  # handed to whoever waits on the future
            future.set_exception(exc)

    with _lock:
        start = _unclaimed == 0
        if not start:
            _unclaimed -= 1
    if start:
        threading.Thread(target=_serve, name="conductor-call", daemon=True).start()
    _jobs.put(job)
    return future


async def on_thread(call: Callable[[], T]) -> T:
    """``call()``'s result, run on a daemon thread (``submit``) while the event loop goes on. Cancelling the await
    abandons the call; it keeps its thread until it returns."""
    return await asyncio.wrap_future(submit(call))


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end from sync code, in a copy of the caller's context, and return its result (or
    raise its error). With no event loop running in this thread, on this thread's own loop (kept, so a call costs no
    loop's creation); with one running (a notebook, sync code called from async code), on a daemon thread's."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        runner = getattr(_loops, "runner", None)
        if runner is None:
            runner = _loops.runner = asyncio.Runner()
        return runner.run(coroutine, context=contextvars.copy_context())
    return submit(lambda: run_sync(coroutine)).result()


def _serve() -> None:
    global _unclaimed
    while True:
        try:
            job = _jobs.get(timeout=IDLE_EXIT_S)
        except queue.Empty:
            with _lock:
                if _unclaimed:  # nobody counts on this thread: it may end
                    _unclaimed -= 1
                    break
            continue  # a job was submitted on this thread's count and is on its way
        job()
        with _lock:
            _unclaimed += 1
    runner = getattr(_loops, "runner", None)
    if runner is not None:  # it ran sync code's coroutines (run_sync): its loop ends with it
        runner.close()
