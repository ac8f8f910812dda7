"""Fuzzed budgets: random workflows with parallel steps over workers with random usage, some of which report more than
they were allowed, under random budgets (0 and no limit included) and a random amount already spent by the conductor.

What must hold in every run: the spend recorded for the steps that kept their reservation, plus the conductor's,
never passes a limit; no more steps run than the step limit allows; every call that reported more than its step
reserved is recorded as reported and stops the run with an error; a worker of unknown price never runs under a cost
budget; the result's tokens and cost are the true totals. Run with ``-s`` to see the counts.
"""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from dataclasses import dataclass

from conductor.errors import WorkerError
from conductor.modules import Budget, Completion, Executor, Price, Step, Usage, Worker, WorkerPool, Workflow

RUNS = 1000
SEED = 20261201
OVER_REPORTS = ("output", "prompt", "cost")  # past max_tokens, a prompt larger than counted, a cost past the hold


@dataclass
class Call:
    """One call as the worker saw it: what it was allowed and what it reported."""

    worker: FuzzWorker
    step: int
    prompt_counted: int  # what count_tokens said, so what the executor reserved for the prompt
    max_tokens: int
    input_tokens: int
    output_tokens: int
    reported_cost: float | None

    def cost(self, price: Price) -> float:
        return (
            self.reported_cost if self.reported_cost is not None else price.cost(self.input_tokens, self.output_tokens)
        )

    def over_reserved(self, budget: Budget) -> bool:
        """Whether this call reported more than the executor reserved for it, on a count a limit watches: output
        tokens always (``max_tokens`` is a limit), all tokens under a token budget, dollars under a cost budget."""
        price = self.worker.price or Price()
        tokens = self.input_tokens + self.output_tokens
        return (
            self.output_tokens > self.max_tokens
            or (budget.max_tokens is not None and tokens > self.prompt_counted + self.max_tokens)
            or (budget.max_cost is not None and self.cost(price) > price.cost(self.prompt_counted, self.max_tokens))
        )


class FuzzWorker(Worker):
    """Answers with random usage within what it is allowed; with probability ``over_rate`` it reports more (one of
    ``OVER_REPORTS``), with ``fail_rate`` it fails. It logs every answered call and the most calls that overlapped."""

    active = 0
    peak = 0
    _lock = threading.Lock()

    def __init__(self, name: str, rng: random.Random, over_rate: float, fail_rate: float, calls: list[Call], **kwargs):
        super().__init__(name, **kwargs)
        self.rng, self.over_rate, self.fail_rate, self.calls = rng, over_rate, fail_rate, calls

    def complete(self, messages, *, max_tokens, temperature):
        with FuzzWorker._lock:
            FuzzWorker.active += 1
            FuzzWorker.peak = max(FuzzWorker.peak, FuzzWorker.active)
            rng = self.rng
            fails = rng.random() < self.fail_rate
            over = rng.choice(OVER_REPORTS) if rng.random() < self.over_rate else None
            prompt = self.count_tokens(messages)
            output = rng.randint(0, max_tokens)
            input_tokens, cost = prompt, None
            if over == "output":
                output = max_tokens + rng.randint(1, 200)
            elif over == "prompt":
                input_tokens = prompt + max_tokens + rng.randint(1, 200)
            elif over == "cost":
                reserved = (self.price or Price()).cost(prompt, max_tokens)
                cost = reserved * rng.uniform(1.01, 3) + rng.uniform(1e-6, 0.05)
            elif rng.random() < 0.2:  # a provider that reports its own cost, below the price's
                cost = (self.price or Price()).cost(prompt, output) * rng.random()
            delay = rng.random() < 0.5
        try:
            if delay:
                threading.Event().wait(0.002)  # let steps running side by side overlap
            if fails:
                raise WorkerError(f"{self.name}: scripted failure", retryable=False)
            completion = Completion("fine", input_tokens, output, cost)
            step = int(re.findall(r"subtask (\d+) ", messages[-1]["content"])[-1])  # its own subtask comes last
            with FuzzWorker._lock:
                self.calls.append(Call(self, step, prompt, max_tokens, input_tokens, output, cost))
            return completion
        finally:
            with FuzzWorker._lock:
                FuzzWorker.active -= 1


def random_limit(rng: random.Random, high: float, whole: bool = True) -> float | None:
    roll = rng.random()
    if roll < 0.35:
        return None
    if roll < 0.4:
        return 0
    return rng.randint(1, int(high)) if whole else rng.uniform(0, high)


def random_run(rng: random.Random) -> tuple[Executor, Workflow, Budget, Usage, list[Call]]:
    calls: list[Call] = []
    workers = []
    for i in range(rng.randint(1, 5)):
        roll = rng.random()
        price = None if roll < 0.08 else Price() if roll < 0.3 else Price(rng.uniform(0, 0.05), rng.uniform(0, 0.2))
        workers.append(
            FuzzWorker(
                f"w{i}",
                random.Random(rng.random()),
                over_rate=rng.choice((0.0, 0.0, 0.05, 0.3)),
                fail_rate=rng.choice((0.0, 0.0, 0.1)),
                calls=calls,
                price=price,
                max_tokens=rng.randint(8, 300),
                retries=0,
            )
        )
    names = [w.name for w in workers]
    fallbacks = {n: [rng.choice([m for m in names if m != n])] for n in names if len(names) > 1 and rng.random() < 0.2}
    pool = WorkerPool(workers, fallbacks=fallbacks)
    steps = []
    for i in range(rng.randint(1, 7)):
        roll = rng.random()
        access = "all" if roll < 0.15 else () if roll < 0.55 else tuple(sorted(rng.sample(range(i), rng.randint(0, i))))
        steps.append(Step(rng.randrange(len(workers)), f"subtask {i} " + "word " * rng.randint(0, 30), access))
    budget = Budget(
        max_steps=random_limit(rng, 7),
        max_tokens=random_limit(rng, 4000),
        max_cost=random_limit(rng, 0.6, whole=False),
        max_tokens_per_step=random_limit(rng, 300),
    )
    conductor = Usage() if rng.random() < 0.4 else Usage(rng.randint(0, 800), rng.randint(0, 200), rng.uniform(0, 0.05))
    executor = Executor(
        pool, max_parallel=rng.randint(2, 4), min_output_tokens=rng.choice((0, 1, 16)), sleep=lambda _: None
    )
    return executor, Workflow(tuple(steps)), budget, conductor, calls


def test_no_run_ever_passes_a_limit_and_every_over_report_stops_its_run():
    rng = random.Random(SEED)
    counts: Counter[str] = Counter()
    for run in range(RUNS):
        executor, workflow, budget, conductor, calls = random_run(rng)
        FuzzWorker.peak = 0
        result = executor.run(workflow, "the question", budget, conductor_usage=conductor)
        where = f"run {run}: {budget}, conductor {conductor}, {workflow}, {result}"

        # every answered call is in the trace as the worker reported it; over-reports stopped the run
        by_step = {s.index: s for s in result.steps}
        answered = [s for s in result.steps if s.answered_by is not None]
        assert len(answered) == len(calls), where
        over = [call for call in calls if call.over_reserved(budget)]
        for call in calls:
            step = by_step[call.step]
            assert step.answered_by == call.worker.name, where
            assert (step.prompt_tokens, step.completion_tokens) == (call.input_tokens, call.output_tokens), where
            assert step.cost == call.cost(call.worker.price or Price()), where
            assert (step.error is not None) == (call in over), where
        if over:
            assert result.answer is None and result.error is not None, where
            first = min(call.step for call in over)
            assert result.error.kind == "budget" or int(result.error.message.split()[1]) < first, where
            counts["runs stopped by an over-report"] += 1
        counts["over-reports"] += len(over)

        # the totals are true: the conductor's spend plus every step's, over-reports included
        assert result.tokens == conductor.tokens + sum(s.prompt_tokens + s.completion_tokens for s in result.steps)
        assert abs(result.cost - (conductor.cost + sum(s.cost for s in result.steps))) <= 1e-12

        # what was allowed never passes a limit
        allowed = [s for s in result.steps if s.error is None or s.answered_by is None]
        tokens = conductor.tokens + sum(s.prompt_tokens + s.completion_tokens for s in allowed)
        cost = conductor.cost + sum(s.cost for s in allowed)
        if budget.max_steps is not None:
            assert len(result.steps) <= budget.max_steps, where
        if budget.max_tokens is not None:
            if conductor.tokens <= budget.max_tokens:
                assert tokens <= budget.max_tokens, where
            else:
                assert not calls, where
        if budget.max_cost is not None:
            if conductor.cost <= budget.max_cost:
                assert cost <= budget.max_cost * (1 + 1e-12), where
            else:
                assert not calls, where
        for step in allowed:
            if step.answered_by is not None:
                assert step.completion_tokens <= executor.pool[executor.pool.names.index(step.answered_by)].max_tokens
                if budget.max_tokens_per_step is not None:
                    assert step.completion_tokens <= budget.max_tokens_per_step, where

        # a worker of unknown price never runs under a cost budget
        if budget.max_cost is not None:
            assert all(call.worker.price is not None for call in calls), where
            if any(w.price is None for w in executor._reachable(workflow)):
                assert result.steps == [] and "is unknown" in result.error.message, where
                counts["runs refused for an unknown price"] += 1

        counts["runs"] += 1
        counts["steps run"] += len(result.steps)
        counts["calls"] += len(calls)
        counts["runs with steps side by side"] += FuzzWorker.peak > 1
        counts["runs ended by a budget error"] += result.error is not None and result.error.kind == "budget"
        counts["runs with a limit of 0"] += 0 in (budget.max_steps, budget.max_tokens, budget.max_cost,
                                                   budget.max_tokens_per_step)  # fmt: skip
        counts["runs with conductor spend"] += conductor != Usage()
    print("\nbudget fuzz:", dict(counts))
    assert counts["runs"] == RUNS and counts["over-reports"] > 50 and counts["runs with steps side by side"] > 50
