"""Daemon threads that are reused: what the executor runs each worker call on, so it can give up on the call after
the worker's timeout. ``concurrent.futures.ThreadPoolExecutor`` doesn't fit: its pool is bounded (hung calls would
use it up) and its threads are joined at interpreter exit (one hung call would keep the process alive). Starting a
fresh daemon thread per call did fit, and was a sixth of a served request's CPU time."""

from __future__ import annotations

import concurrent.futures
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

IDLE_EXIT_S = 60.0
"""How long a thread waits for the next call before it ends."""

_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_lock = threading.Lock()
_unclaimed = 0  # threads waiting for a job that no submitted job has counted on yet


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


def _serve() -> None:
    global _unclaimed
    while True:
        try:
            job = _jobs.get(timeout=IDLE_EXIT_S)
        except queue.Empty:
            with _lock:
                if _unclaimed:  # nobody counts on this thread: it may end
                    _unclaimed -= 1
                    return
            continue  # a job was submitted on this thread's count and is on its way
        job()
        with _lock:
            _unclaimed += 1
