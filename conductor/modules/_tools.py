"""Tool workers: any Python callable as a worker.

Tools take part in a workflow like any model: the conductor hands them a subtask in plain text, and they answer with
text. Each tool picks what it needs out of the prompt (a code block, an expression) with its ``extract`` function.
The built-in tools are the sandboxed Python runner (``_sandbox.py``) and the calculator (``_calculator.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from conductor.errors import WorkerError
from conductor.modules._worker import Completion, Messages, Worker

TRUNCATED = "[output truncated]"


def _identity(text: str) -> str:
    return text


def _fit(text: str, max_tokens: int) -> str:
    """Cut ``text`` so its estimate (1 token per 3 characters) fits ``max_tokens``, marking the cut where it fits."""
    budget = max(max_tokens, 0) * 3
    if len(text) <= budget:
        return text
    marker = f"\n{TRUNCATED}"
    if budget >= 2 * len(marker):
        return text[: budget - len(marker)] + marker
    return text[:budget]


class ToolWorker(Worker):
    """A worker that answers with ``fn`` applied to the last user message.

    ``extract`` picks the tool's input out of that message (default: all of it); ``fn`` may return any object, and
    its ``str`` is the answer. Tools have no tokenizer, so token counts are estimates, and the answer is cut to fit
    ``max_tokens``. Whatever ``fn`` or ``extract`` raises becomes a ``WorkerError`` naming the worker.
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[str], Any],
        *,
        extract: Callable[[str], str] | None = None,
        **worker_kwargs: Any,
    ):
        super().__init__(name, **worker_kwargs)
        self.fn = fn
        self.extract = extract or _identity

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), None)
        if text is None:
            raise WorkerError(f"{self.name}: no user message to answer")
        try:
            answer = str(self.fn(self.extract(text)))
        except WorkerError as exc:  # keep the kind (and so whether a retry can help), add the worker's name
            raise type(exc)(f"{self.name}: {exc}", retryable=exc.retryable) from exc
        except Exception as exc:
            raise WorkerError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        answer = _fit(answer, max_tokens)
        return Completion(answer, self.count_tokens(messages), math.ceil(len(answer) / 3))
