"""The value types of a run: what a run may spend (``Budget``), what the conductor LM spent on it (``Usage``), what
each step did (``StepTrace``), why a run has no answer (``RunError``) and the run's result (``RunResult``).

They live below the executor and tracing, which both read them, and are what programs, deployment and optimizers pass
around; so code that only needs a ``Budget`` doesn't import the executor.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Annotated, Literal

import pydantic

from conductor.errors import ConfigError
from conductor.modules.workflow import Workflow


@dataclass(frozen=True)
class Usage:
    """Tokens and dollars a run spent outside its workflow's steps: the conductor LM's own calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost + other.cost,
        )


@dataclass(frozen=True)
class Budget:
    """Limits for one run. ``None`` means unlimited and 0 means nothing may be spent (a cost limit of 0 still lets
    free workers run). Tokens count prompt and completion tokens of every step and of the conductor LM's own calls.
    A limit that is negative, NaN, infinite or not a number is refused with a ``ConfigError``."""

    max_steps: Annotated[int | None, pydantic.Field(description="the most steps a run may take")] = None
    max_tokens: Annotated[
        int | None, pydantic.Field(description="the most prompt and completion tokens, the conductor LM's included")
    ] = None
    max_cost: Annotated[float | None, pydantic.Field(description="the most dollars a run may spend")] = None
    max_tokens_per_step: Annotated[
        int | None, pydantic.Field(description="caps each worker's own max_tokens (its longest answer)")
    ] = None

    def __post_init__(self) -> None:
        problems = []
        for limit in fields(self):
            value = getattr(self, limit.name)
            kind = numbers.Real if limit.name == "max_cost" else numbers.Integral
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                problems.append(f"{limit.name} must be {'a number' if kind is numbers.Real else 'a whole number'}")
            elif not math.isfinite(value):
                problems.append(f"{limit.name} must be finite (None means no limit)")
            elif value < 0:
                problems.append(f"{limit.name} must not be negative")
        if problems:
            raise ConfigError(f"invalid budget: {'; '.join(problems)}")

    def remaining(self, spent: Sequence[StepTrace], conductor_usage: Usage = Usage()) -> Budget:
        """What is left once the steps ``spent`` ran and the conductor LM used ``conductor_usage``: the budget of a
        later round of the same run (a recursive round of the Conductor), so that all its rounds together stay within
        this one. The conductor's calls count against tokens and cost, not steps."""
        tokens = conductor_usage.tokens + sum(s.prompt_tokens + s.completion_tokens for s in spent)
        cost = conductor_usage.cost + sum(s.cost for s in spent)
        return replace(
            self,
            max_steps=None if self.max_steps is None else max(self.max_steps - len(spent), 0),
            max_tokens=None if self.max_tokens is None else max(self.max_tokens - tokens, 0),
            max_cost=None if self.max_cost is None else max(self.max_cost - cost, 0.0),
        )


@dataclass
class StepTrace:
    """What one step did: who ran it, what it saw, what it cost, and how it ended.

    ``worker`` is the worker the workflow assigned; ``answered_by`` the one whose answer this is (``worker`` or one of
    its fallbacks; ``None`` if none answered), and ``fallback_reason`` why the workers before it were passed over.
    ``attempts`` counts calls to every worker tried; ``cost`` is the provider's reported cost, else the worker's price.
    Tokens and cost are what the answering call reported, also when that was more than the step reserved (then
    ``error`` says so, and the run stopped); a step no worker answered records none, as the budget counts none.
    """

    index: int
    worker_index: int
    worker: str
    role: str
    subtask: str
    visible: tuple[int, ...]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_s: float = 0.0
    attempts: int = 0
    output: str | None = None
    error: str | None = None
    answered_by: str | None = None
    fallback_reason: str | None = None


@dataclass(frozen=True)
class RunError:
    """Why a run has no answer. ``kind``: ``format`` (the conductor's workflow was unusable; a fallback may still
    have answered), ``execution`` (a worker failed for good), ``budget`` (the next step would not fit), ``input``."""

    kind: Literal["format", "execution", "budget", "input"]
    message: str

    def __str__(self) -> str:
        return f"{self.kind} error: {self.message}"


@dataclass
class RunResult:
    """A run's answer (the last step's output), its steps in workflow order, and why it has no answer if so.

    Its tokens and cost are those of every step plus ``conductor_usage``, what the conductor LM spent on the run.
    """

    answer: str | None
    steps: list[StepTrace] = field(default_factory=list)
    error: RunError | None = None
    workflow: Workflow | None = None
    conductor_usage: Usage = Usage()

    @property
    def prompt_tokens(self) -> int:
        return self.conductor_usage.prompt_tokens + sum(s.prompt_tokens for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return self.conductor_usage.completion_tokens + sum(s.completion_tokens for s in self.steps)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost(self) -> float:
        return self.conductor_usage.cost + sum(s.cost for s in self.steps)

    def cost_by_worker(self) -> dict[str, float]:
        """Dollars per worker that answered (a step a fallback took is billed to the fallback); the conductor LM's own
        calls are in ``conductor_usage``."""
        costs: dict[str, float] = {}
        for step in self.steps:
            name = step.answered_by or step.worker
            costs[name] = costs.get(name, 0.0) + step.cost
        return costs

    def cost_by_step(self) -> dict[int, float]:
        """Dollars per step index, for the steps that ran."""
        return {step.index: step.cost for step in self.steps}
