"""``CallLimits``: how many calls of one worker may be in flight, and how often one may start.

Providers cap concurrent requests and requests per minute. A worker's limits are shared by every run that calls it
(the side-by-side steps of one run, a GRPO group's rollouts, a server's requests), so together they stay within the
provider's caps while calls still overlap up to them, on threads and event loops alike (so the slots are a thread
semaphore, not a loop-bound ``asyncio.Semaphore``). Hand-written rather than a rate-limit library: a semaphore and an
even spacing of call starts are all that is needed, and neither needs storage or bursts.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator

from conductor.errors import ConfigError
from conductor.modules import _threads


class CallLimits:
    """At most ``max_concurrency`` calls in flight, and call starts at least ``60 / requests_per_minute`` seconds
    apart (``None``: no limit), across threads and event loops; waiting for a turn is not part of a call's timeout."""

    def __init__(self, max_concurrency: int | None = None, requests_per_minute: float | None = None):
        if max_concurrency is not None and max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be at least 1, not {max_concurrency}")
        if requests_per_minute is not None and not requests_per_minute > 0:
            raise ConfigError(f"requests_per_minute must be positive, not {requests_per_minute}")
        self.max_concurrency = max_concurrency
        self.requests_per_minute = requests_per_minute
        self._slots = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
        self._spacing = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._next_start = 0.0
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        """Pickled as its settings (a saved DSPy program, a Ray actor's copy): a copy's slots start free."""
        return type(self), (self.max_concurrency, self.requests_per_minute)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for a free slot and for the next start time, then hold the slot while the call runs. The event loop
        never blocks: a free slot is taken at once, and only a worker at its limit waits for one, on a daemon thread;
        the wait for the start time is an ``asyncio.sleep``."""
        if self._slots is not None and not self._slots.acquire(blocking=False):
            await self._wait_for_slot()
        try:
            if self._spacing:
                with self._lock:
                    now = time.monotonic()
                    start = max(now, self._next_start)
                    self._next_start = start + self._spacing
                await asyncio.sleep(start - now)
            yield
        finally:
            if self._slots is not None:
                self._slots.release()

    async def _wait_for_slot(self) -> None:
        slots = self._slots
        waiting = _threads.submit(slots.acquire)
        try:
            await asyncio.wrap_future(waiting)
        except asyncio.CancelledError:  # the thread may still get the slot: it is given back then
            waiting.add_done_callback(lambda done: done.cancelled() or slots.release())
            raise
