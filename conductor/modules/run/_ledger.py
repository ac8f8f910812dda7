"""The budget ledger of one run: what it has spent plus what its running steps hold.

Before a step starts it *reserves* its worst case (its prompt plus the largest ``max_tokens`` that still fits, and
their cost) and when it ends it *settles*, giving back the unused part; so steps running side by side can never
jointly pass a limit (see the executor's docstring).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from conductor.errors import BudgetExceeded
from conductor.modules.run._types import Budget, Usage
from conductor.modules.workers import FREE, Completion, Price, Worker


@dataclass(eq=False)
class Hold:
    """Budget reserved for one call: its prompt, the most output it may write, and what both cost at most."""

    prompt_tokens: int
    max_tokens: int
    cost: float


class Ledger:
    """What a run has spent (from the conductor LM's usage on) plus what its running steps hold. Thread-safe:
    reserving checks and holds under one lock, so steps running together can never jointly pass the budget."""

    def __init__(self, budget: Budget, min_output_tokens: int, spent: Usage = Usage()):
        self.budget = budget
        self.min_output_tokens = min_output_tokens
        self._spent_tokens = spent.tokens
        self._spent_cost = spent.cost
        self._holds: set[Hold] = set()
        self._lock = threading.Lock()

    @property
    def counts_prompts(self) -> bool:
        """Whether a step's prompt size matters to the budget: only a token or a cost limit counts it."""
        return self.budget.max_tokens is not None or self.budget.max_cost is not None

    def price(self, worker: Worker) -> Price:
        """``worker``'s price. An unknown one counts as free only while no cost limit needs it: under a cost budget,
        ``BudgetExceeded`` says how to give it one."""
        if worker.price is not None:
            return worker.price
        if self.budget.max_cost is None:
            return FREE
        raise BudgetExceeded(
            f"the price of worker {worker.name!r} is unknown (litellm's cost map doesn't list its model), so it can't "
            f"run under a cost budget of ${self.budget.max_cost:g}: give it a price (Price(input_per_1k, "
            f"output_per_1k) in code, `price: {{input_per_1k: ..., output_per_1k: ...}}` in a pool config)"
        )

    def reserve(self, worker: Worker, index: int, prompt_tokens: int) -> Hold:
        """Hold step ``index``'s worst case on ``worker``, or raise ``BudgetExceeded`` if even the least won't fit.
        ``prompt_tokens`` may be 0 where the prompt isn't counted (``counts_prompts`` is false)."""
        price = self.price(worker)
        with self._lock:
            max_tokens = self._affordable_output(worker, price, index, prompt_tokens)
            hold = Hold(prompt_tokens, max_tokens, price.cost(prompt_tokens, max_tokens))
            self._holds.add(hold)
        return hold

    def settle(self, hold: Hold, completion: Completion | None = None, cost: float = 0.0) -> str | None:
        """Replace what ``hold`` reserved by what the call really used (nothing, when it failed, so ``completion``
        is ``None``); return how that is more than was reserved, if it is."""
        tokens = 0 if completion is None else completion.input_tokens + completion.output_tokens
        with self._lock:
            self._holds.discard(hold)
            self._spent_tokens += tokens
            self._spent_cost += cost
        if completion is None:
            return None
        if completion.output_tokens > hold.max_tokens:
            return f"wrote {completion.output_tokens} output tokens, more than the {hold.max_tokens} it was allowed"
        if self.budget.max_tokens is not None and tokens > hold.prompt_tokens + hold.max_tokens:
            return f"used {tokens} tokens, more than the {hold.prompt_tokens + hold.max_tokens} reserved for it"
        if self.budget.max_cost is not None and cost > hold.cost:
            return f"cost ${cost:g}, more than the ${hold.cost:g} reserved for it"
        return None

    def _affordable_output(self, worker: Worker, price: Price, index: int, prompt_tokens: int) -> int:
        """The largest ``max_tokens`` this step may use without any budget being exceeded, or ``BudgetExceeded``."""
        budget = self.budget
        if budget.max_steps is not None and index >= budget.max_steps:
            raise BudgetExceeded(f"the step budget of {budget.max_steps} is used up")
        limit = worker.max_tokens
        if budget.max_tokens_per_step is not None:
            limit = min(limit, budget.max_tokens_per_step)
        if budget.max_tokens is not None:
            used = self._spent_tokens + sum(h.prompt_tokens + h.max_tokens for h in self._holds)
            limit = min(limit, budget.max_tokens - used - prompt_tokens)
        if budget.max_cost is not None:
            used = self._spent_cost + sum(h.cost for h in self._holds)
            if used + price.cost(prompt_tokens, 0) > budget.max_cost:
                raise BudgetExceeded(f"the prompt alone would pass the cost budget of ${budget.max_cost:g}")
            if price.output_per_1k > 0:
                left = budget.max_cost - used - price.cost(prompt_tokens, 0)
                limit = min(limit, math.floor(left * 1000 / price.output_per_1k))
                while limit > 0 and used + price.cost(prompt_tokens, limit) > budget.max_cost:  # float rounding
                    limit -= 1
        if limit < self.min_output_tokens:
            raise BudgetExceeded(
                f"{max(limit, 0)} output tokens would fit, fewer than the minimum of {self.min_output_tokens}"
            )
        return limit
