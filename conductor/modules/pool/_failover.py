"""Provider failover: a circuit breaker per worker, shared by every run over a pool, and the order to try workers in.

A worker that fails ``failure_threshold`` times within ``window_s`` seconds is *cooled down* for ``cooldown_s``:
steps assigned to it go to its fallbacks (``WorkerPool.fallbacks``) without calling it. When the cooldown ends it is
tried again; one more failure cools it down at once (a half-open breaker), a success clears its record. Only errors
that may pass count (``WorkerError.retryable``): a tool refusing a malformed input says nothing about its health.
Fallbacks are not transitive: a step tries its worker, then that worker's own fallbacks, in the order listed.

Why not litellm's ``Router``: it has the same ideas (``allowed_fails``, ``cooldown_time``, ``fallbacks``), but it
routes between litellm deployments and makes the calls itself. Our workers are also in-process models and Python
tools that litellm can't call, and retries, timeouts and budgets already belong to the executor; a Router would cover
only the API workers and bring a second retry loop. This small breaker over the ``Worker`` interface serves every
worker kind the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from conductor.modules.pool._pool import WorkerPool
from conductor.modules.workers import Worker

logger = logging.getLogger(__name__)


class WorkerHealth:
    """Recent failures and cooldowns of workers, by name. Thread-safe; share one object between every run and
    executor that use the same pool, since it describes the providers, not a program (copies of a program share it:
    ``deepcopy`` returns the same object; a pickled copy in another process starts from the record as it was).
    ``clock`` returns seconds and is injectable for tests."""

    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        window_s: float = 60.0,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if failure_threshold < 1 or window_s <= 0 or cooldown_s < 0:
            raise ValueError("need failure_threshold >= 1, window_s > 0 and cooldown_s >= 0")
        self.failure_threshold = failure_threshold
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._cooled_until: dict[str, float] = {}  # kept after the cooldown ends: the worker is on probation
        self._lock = threading.Lock()

    def cooldown_left(self, name: str) -> float:
        """Seconds until worker ``name`` may be called again; 0 when it may be called now."""
        until = self._cooled_until.get(name)  # one dict read is atomic: no lock on the hot path
        return 0.0 if until is None else max(0.0, until - self._clock())

    def record_success(self, name: str) -> None:
        """Worker ``name`` answered: forget its failures and any cooldown."""
        if name not in self._failures and name not in self._cooled_until:  # the usual case: nothing to clear
            return
        with self._lock:
            self._failures.pop(name, None)
            self._cooled_until.pop(name, None)

    def record_failure(self, name: str) -> None:
        """Worker ``name`` failed with an error that may pass: count it, and cool the worker down at the threshold."""
        with self._lock:
            now = self._clock()
            until = self._cooled_until.get(name)
            if until is not None:
                if now >= until:  # failed on probation: straight back to cooling down
                    self._cool_down(name, now, "failed again after its cooldown")
                return  # else a call that started before the cooldown: already counted
            failures = self._failures.setdefault(name, deque())
            failures.append(now)
            while failures[0] <= now - self.window_s:
                failures.popleft()
            if len(failures) >= self.failure_threshold:
                self._cool_down(name, now, f"failed {len(failures)} times within {self.window_s:g} s")

    def _cool_down(self, name: str, now: float, why: str) -> None:
        self._failures.pop(name, None)
        self._cooled_until[name] = now + self.cooldown_s
        logger.warning("%s %s; cooling it down for %g s", name, why, self.cooldown_s)

    def __deepcopy__(self, memo: dict) -> WorkerHealth:
        return self

    def __getstate__(self) -> dict:  # pickling (e.g. a program sent to another process) keeps the record, not the lock
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def route(pool: WorkerPool, health: WorkerHealth, worker_index: int) -> tuple[list[Worker], list[str]]:
    """The workers a step assigned to ``pool[worker_index]`` may try, in order (the worker, then its fallbacks),
    leaving out those cooling down; and a note for each one left out."""
    assigned = pool[worker_index]
    candidates = [assigned, *(pool[pool.names.index(name)] for name in pool.fallbacks.get(assigned.name, ()))]
    workers, notes = [], []
    for worker in candidates:
        left = health.cooldown_left(worker.name)
        if left > 0:
            notes.append(f"{worker.name} is cooling down ({left:.1f} s left)")
        else:
            workers.append(worker)
    return workers, notes
