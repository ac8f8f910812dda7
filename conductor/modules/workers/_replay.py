"""``ReplayWorker``: a worker that answers a prompt it has answered before with the same completion.

For experiments that compare workflows over one pool: methods that send a worker the same prompt (the single worker,
the first sample of a vote, the candidate a checker checks) share one sampled completion, so their scores differ only
by what the workflows do with it (a paired comparison), and the pool's slow models run once per distinct prompt.
A ``ReplayStore`` keeps the completions on disk, so that the processes of one run and runs of different configs
share them too.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

from conductor.errors import ConfigError
from conductor.modules.workers._worker import Completion, Messages, Worker


class ReplayStore:
    """Replayed completions in one SQLite file that any number of processes and runs share: the first completion
    stored for a call is the one every later call gets, whichever process asked first. A call is keyed by the
    worker's name and its messages, ``max_tokens`` and ``temperature``, so a store belongs to one pool's workers.

    Hand-written on the standard library's ``sqlite3`` rather than a cache library: the rows are plain text and
    numbers, read back without unpickling anything, and SQLite's locking makes "first writer wins" one statement.
    A connection is opened per call (a model call takes seconds, a connection microseconds), so a store holds no
    handle to share between threads or to carry across a fork, and pickles as its path."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as db, db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS completions (call TEXT PRIMARY KEY, text TEXT NOT NULL, "
                    "input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cost REAL)"
                )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"can't use {self.path} as a replay store: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def get(self, call: str) -> Completion | None:
        with closing(self._connect()) as db:
            return _stored(db, call)

    def keep(self, call: str, completion: Completion) -> Completion:
        """Stores ``completion`` unless another process stored one for ``call`` first; returns the one stored."""
        with closing(self._connect()) as db, db:
            db.execute(
                "INSERT OR IGNORE INTO completions VALUES (?, ?, ?, ?, ?)", (call, *dataclasses.astuple(completion))
            )
            return _stored(db, call) or completion

    def __len__(self) -> int:
        with closing(self._connect()) as db:
            return db.execute("SELECT count(*) FROM completions").fetchone()[0]


def _stored(db: sqlite3.Connection, call: str) -> Completion | None:
    row = db.execute(
        "SELECT text, input_tokens, output_tokens, cost FROM completions WHERE call = ?", (call,)
    ).fetchone()
    return None if row is None else Completion(*row)


class ReplayWorker(Worker):
    """Wraps ``worker`` (same name, description, price and limits); a call with the same messages, ``max_tokens``
    and ``temperature`` as an earlier one returns that call's completion without calling ``worker``. Failed calls
    are not kept. Thread-safe: the same prompt sent again while its first call runs waits for that call's answer,
    so each distinct prompt is one call (program search counts on it). ``calls`` and ``tokens`` count the calls
    passed on to ``worker`` (failed ones included) and the tokens of those that answered: what replay did not save."""

    def __init__(self, worker: Worker, store: ReplayStore | None = None):
        super().__init__(
            worker.name,
            description=worker.description,
            price=worker.price,
            max_tokens=worker.max_tokens,
            temperature=worker.temperature,
            timeout_s=worker.timeout_s,
            retries=worker.retries,
            framing=worker.framing,  # the executor words its steps as for the worker it replays
        )
        self.worker = worker
        self.store = store
        self._answers: dict[str, Completion] = {}
        self._calling: dict[str, threading.Lock] = {}  # one per prompt: held while its call runs
        self._lock = threading.Lock()
        self.calls = 0
        self.tokens = 0

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        key = json.dumps([self.name, messages, max_tokens, temperature], sort_keys=True)
        with self._lock:
            answer = self._answers.get(key)
            calling = self._calling.setdefault(key, threading.Lock())
        if answer is not None:
            return answer
        with calling:
            with self._lock:
                answer = self._answers.get(key)
            if answer is None and self.store is not None:
                answer = self.store.get(key)
            if answer is None:
                with self._lock:
                    self.calls += 1
                answer = self.worker.complete(messages, max_tokens=max_tokens, temperature=temperature)
                with self._lock:
                    self.tokens += answer.input_tokens + answer.output_tokens
                if self.store is not None:
                    answer = self.store.keep(key, answer)
            with self._lock:
                self._answers[key] = answer
        return answer

    def count_tokens(self, messages: Messages) -> int:
        return self.worker.count_tokens(messages)

    def close(self) -> None:
        self.worker.close()
