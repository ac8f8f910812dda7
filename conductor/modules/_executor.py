"""The executor: runs a validated workflow over a pool, one step at a time, within a budget.

Each step's worker gets a plain-text prompt (its role's instructions; the overall task; the subtask and response of
every earlier step its access list allows; its own subtask). A worker that raises or times out is retried with
exponential backoff; when its retries are spent the run stops with the steps done so far and the reason. Budgets
are checked *before* each call: a step's ``max_tokens`` is shrunk to what the budget still allows, and a step that
can't fit is not started.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import dspy
import tenacity

from conductor.errors import BudgetExceeded, WorkerError, WorkerTimeout
from conductor.modules._pool import WorkerPool
from conductor.modules._prompts import WorkerPromptAdapter
from conductor.modules._worker import Completion, Worker
from conductor.modules._workflow import Workflow
from conductor.signatures import BUILTIN_ROLES, role_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """Limits for one run. ``None`` means unlimited. Tokens count prompt and completion tokens of every step."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    max_tokens_per_step: int | None = None  # caps each worker's own max_tokens


@dataclass
class StepTrace:
    """What one step did: who ran it, what it saw, what it cost, and how it ended."""

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
    answer: str | None
    steps: list[StepTrace] = field(default_factory=list)
    error: RunError | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.steps)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost(self) -> float:
        return sum(s.cost for s in self.steps)


class Executor:
    """Runs workflows over ``pool``. ``roles`` maps role names to the ``dspy.Predict`` that holds each role's
    (possibly optimized) instructions and demos; the Conductor passes its own so optimizers' edits take effect."""

    def __init__(
        self,
        pool: WorkerPool,
        roles: Mapping[str, dspy.Predict] | None = None,
        *,
        default_role: str = "solve",
        budget: Budget = Budget(),
        backoff_s: float = 0.5,
        min_output_tokens: int = 16,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.pool = pool
        self.roles = dict(roles) if roles is not None else {role_name(r): dspy.Predict(r) for r in BUILTIN_ROLES}
        if default_role not in self.roles:
            raise ValueError(f"default role {default_role!r} is not among the roles {sorted(self.roles)}")
        self.default_role = default_role
        self.budget = budget
        self.backoff_s = backoff_s
        self.min_output_tokens = min_output_tokens
        self._sleep = sleep
        self._adapter = WorkerPromptAdapter()

    def run(self, workflow: Workflow, question: str, budget: Budget | None = None) -> RunResult:
        """Run ``workflow`` (already validated against this pool) on ``question``."""
        budget = budget or self.budget
        result = RunResult(answer=None)
        for index, step in enumerate(workflow.steps):
            role = step.role or self.default_role
            trace = StepTrace(
                index, step.worker, self.pool[step.worker].name, role, step.subtask, workflow.visible(index)
            )
            try:
                self._run_step(trace, question, result, budget)
            except BudgetExceeded as exc:
                result.error = RunError("budget", f"step {index} not run: {exc}")
                return result
            finally:
                if trace.attempts:
                    result.steps.append(trace)
            if trace.error is not None:
                result.error = RunError(
                    "execution", f"step {index} ({trace.worker}) failed after {trace.attempts} attempts: {trace.error}"
                )
                return result
        result.answer = result.steps[-1].output if result.steps else None
        return result

    # ---- one step ------------------------------------------------------------------------------------------------
    def _run_step(self, trace: StepTrace, question: str, done: RunResult, budget: Budget) -> None:
        worker = self.pool[trace.worker_index]
        predictor = self.roles[trace.role]
        inputs = {"question": question, "context": _context(done.steps, trace.visible), "subtask": trace.subtask}
        inputs = {k: v for k, v in inputs.items() if k in predictor.signature.input_fields}
        messages = self._adapter.format(predictor.signature, predictor.demos, inputs)
        trace.prompt_tokens = worker.count_tokens(messages)
        max_tokens = self._affordable_output(worker, trace, done, budget)

        started = time.perf_counter()
        try:
            completion = self._call_with_retries(worker, messages, max_tokens, trace)
        except WorkerError as exc:
            trace.error = str(exc)
            trace.latency_s = time.perf_counter() - started
            return
        trace.latency_s = time.perf_counter() - started
        trace.prompt_tokens, trace.completion_tokens = completion.input_tokens, completion.output_tokens
        trace.cost = (
            completion.cost
            if completion.cost is not None
            else worker.price.cost(completion.input_tokens, completion.output_tokens)
        )
        trace.output = self._adapter.parse(predictor.signature, completion.text)[_output_field(predictor)]
        if dspy.settings.trace is not None:  # let DSPy optimizers see worker steps like any predictor call
            dspy.settings.trace.append((predictor, inputs, dspy.Prediction(**{_output_field(predictor): trace.output})))

    def _affordable_output(self, worker: Worker, trace: StepTrace, done: RunResult, budget: Budget) -> int:
        """The largest ``max_tokens`` this step may use without any budget being exceeded, or ``BudgetExceeded``."""
        if budget.max_steps is not None and trace.index >= budget.max_steps:
            raise BudgetExceeded(f"the step budget of {budget.max_steps} is used up")
        limit = min(worker.max_tokens, budget.max_tokens_per_step or worker.max_tokens)
        if budget.max_tokens is not None:
            limit = min(limit, budget.max_tokens - done.tokens - trace.prompt_tokens)
        if budget.max_cost is not None:
            left = budget.max_cost - done.cost - worker.price.cost(trace.prompt_tokens, 0)
            if left < 0:
                raise BudgetExceeded(f"the prompt alone would pass the cost budget of ${budget.max_cost:g}")
            if worker.price.output_per_1k > 0:
                limit = min(limit, math.floor(left * 1000 / worker.price.output_per_1k))
        if limit < self.min_output_tokens:
            raise BudgetExceeded(
                f"{max(limit, 0)} output tokens would fit, fewer than the minimum of {self.min_output_tokens}"
            )
        return limit

    def _call_with_retries(self, worker: Worker, messages, max_tokens: int, trace: StepTrace) -> Completion:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(worker.retries + 1),
            wait=tenacity.wait_exponential_jitter(initial=self.backoff_s, max=30 * self.backoff_s),
            retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, WorkerError) and exc.retryable),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda state: logger.warning(
                "%s failed (attempt %d): %s", worker.name, state.attempt_number, state.outcome.exception()
            ),
        )
        for attempt in retrying:
            with attempt:
                trace.attempts = attempt.retry_state.attempt_number
                return _call_with_timeout(
                    lambda: worker.complete(messages, max_tokens=max_tokens, temperature=worker.temperature),
                    worker,
                )
        raise AssertionError("unreachable: tenacity reraises the last error")


def _call_with_timeout(call: Callable[[], Completion], worker: Worker) -> Completion:
    """Run ``call`` in a daemon thread and give up after the worker's timeout. A Python thread can't be killed, so
    a hung call is abandoned (daemon: it won't keep the process alive); tools that run code kill their own process."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"worker-{worker.name}", daemon=True)
    thread.start()
    thread.join(worker.timeout_s)
    if thread.is_alive():
        raise WorkerTimeout(f"{worker.name} did not answer within {worker.timeout_s:g} s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, WorkerError):
            raise error
        raise WorkerError(f"{worker.name}: {type(error).__name__}: {error}") from error
    return box["value"]  # type: ignore[return-value]


def _context(steps: list[StepTrace], visible: tuple[int, ...]) -> str:
    parts = []
    for j in visible:
        step = steps[j]
        parts.append(
            f"Step {j} (Model {step.worker_index}) subtask: {step.subtask}\n"
            f"Step {j} (Model {step.worker_index}) response:\n{step.output}"
        )
    return "\n\n".join(parts)


def _output_field(predictor: dspy.Predict) -> str:
    return next(iter(predictor.signature.output_fields))
