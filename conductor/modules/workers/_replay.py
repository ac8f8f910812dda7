"""``ReplayWorker``: a worker that answers a prompt it has answered before with the same completion.

For experiments that compare workflows over one pool: methods that send a worker the same prompt (the single worker,
the first sample of a vote, the candidate a checker checks) share one sampled completion, so their scores differ only
by what the workflows do with it (a paired comparison), and the pool's slow models run once per distinct prompt.
"""

from __future__ import annotations

import json
import threading

from conductor.modules.workers._worker import Completion, Messages, Worker


class ReplayWorker(Worker):
    """Wraps ``worker`` (same name, description, price and limits); a call with the same messages, ``max_tokens``
    and ``temperature`` as an earlier one returns that call's completion without calling ``worker``. Failed calls
    are not kept. Thread-safe: the same prompt sent again while its first call runs waits for that call's answer,
    so each distinct prompt is one call (program search counts on it). ``calls`` and ``tokens`` count the calls
    passed on to ``worker`` (failed ones included) and the tokens of those that answered: what replay did not save."""

    def __init__(self, worker: Worker):
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
        self._answers: dict[str, Completion] = {}
        self._calling: dict[str, threading.Lock] = {}  # one per prompt: held while its call runs
        self._lock = threading.Lock()
        self.calls = 0
        self.tokens = 0

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        key = json.dumps([messages, max_tokens, temperature], sort_keys=True)
        with self._lock:
            answer = self._answers.get(key)
            calling = self._calling.setdefault(key, threading.Lock())
        if answer is not None:
            return answer
        with calling:
            with self._lock:
                answer = self._answers.get(key)
                self.calls += answer is None
            if answer is None:
                answer = self.worker.complete(messages, max_tokens=max_tokens, temperature=temperature)
                with self._lock:
                    self._answers[key] = answer
                    self.tokens += answer.input_tokens + answer.output_tokens
        return answer

    def count_tokens(self, messages: Messages) -> int:
        return self.worker.count_tokens(messages)

    def close(self) -> None:
        self.worker.close()
