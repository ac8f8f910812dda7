"""The executor: runs a validated workflow over a pool within a budget, independent steps side by side.

Each step's worker gets a plain-text prompt (its role's instructions; the overall task; the subtask and response of
every earlier step its access list allows; its own subtask), or, for a worker whose framing is ``"plain"`` on a step
that answers the whole question on its own, the question alone (``WorkerPromptAdapter``). A worker that raises or
times out is retried with exponential backoff; a worker that keeps failing is cooled down and its fallbacks take its
steps (``pool/_failover.py``). When no worker answers a step, no new step starts, running ones finish, and the run ends
with the steps done so far and the reason.

Steps start in workflow order, each once every step it sees has finished, at most ``max_parallel`` at a time; a step
never overtakes an earlier one still waiting, so the steps started are always a prefix of the workflow. With workers
whose answers depend only on their prompts, a run's result (steps in workflow order, answers, tokens, costs) is the
one a sequential run gives; after a failure it also keeps the steps that were running beside the failed one.

A run is a coroutine (``Executor.arun``) and each step an asyncio task in a copy of the run's context (``dspy.context``
settings, the current span). An API worker's call is awaited on the event loop, so a run over API workers holds no
thread; a blocking worker's call (a local model, a tool) runs on a daemon thread (``Worker.acomplete_step``), which a
call past its timeout keeps while the run goes on. ``Executor.run`` is the same run for sync code (``run_sync``).

Budgets hold under parallelism: before a step starts it *reserves* its worst case (its prompt plus the largest
``max_tokens`` that still fits, and their cost), and gives back the unused part when it ends, so steps running
together can never jointly pass a limit; a step that can't fit is not started (the ledger, ``_ledger.py``). (Under a
tight budget, steps started side by side may therefore get a smaller ``max_tokens`` than they would one after
another.) A call that reports more than its step reserved (a worker breaking its contract) is recorded as it was, and
stops the run with a budget error.
Limits count from what the conductor LM already spent on the run (``Executor.run(..., conductor_usage=...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import dspy
import tenacity
from dspy.utils.callback import with_callbacks

from conductor.errors import BudgetExceeded, ConfigError, WorkerError, WorkerTimeout
from conductor.modules import _threads
from conductor.modules.pool import WorkerHealth, WorkerPool, route
from conductor.modules.run import _tracing
from conductor.modules.run._ledger import Hold, Ledger
from conductor.modules.run._types import Budget, RunError, RunResult, StepTrace, Usage
from conductor.modules.workers import Completion, Messages, Worker
from conductor.modules.workflow import WorkerPromptAdapter, Workflow
from conductor.signatures import BUILTIN_ROLES, role_name

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Step:
    """A step ready to start: its trace and prompt (in the framing of the worker it tries), the workers it may try
    (with notes on those left out), and the budget already held for the first of them. Once it ran, ``failure`` says
    why the run must stop, if it must."""

    trace: StepTrace
    predictor: dspy.Predict
    inputs: dict[str, str]
    messages: Messages
    workers: list[Worker]
    notes: list[str]
    hold: Hold | None
    failure: RunError | None = None


class Executor:
    """Runs workflows over ``pool``. ``roles`` maps role names to the ``dspy.Predict`` that holds each role's
    (possibly optimized) instructions and demos; the Conductor passes its own so optimizers' edits take effect.

    ``max_parallel`` steps at most run at once (1: one after another). ``health`` is the pool's failure record that
    decides cooldowns; pass the same ``WorkerHealth`` to every executor over one pool. ``sleep`` waits between a
    worker's retries: a coroutine function (the default, ``asyncio.sleep``) or a plain function (a test's stand-in).
    """

    def __init__(
        self,
        pool: WorkerPool,
        roles: Mapping[str, dspy.Predict] | None = None,
        *,
        default_role: str = "solve",
        budget: Budget = Budget(),
        max_parallel: int = 4,
        health: WorkerHealth | None = None,
        backoff_s: float = 0.5,
        min_output_tokens: int = 16,
        sleep: Callable[[float], Awaitable[None] | None] = asyncio.sleep,
    ):
        self.pool = pool
        self.roles = dict(roles) if roles is not None else {role_name(r): dspy.Predict(r) for r in BUILTIN_ROLES}
        if default_role not in self.roles:
            raise ConfigError(f"default role {default_role!r} is not among the roles {sorted(self.roles)}")
        if max_parallel < 1:
            raise ConfigError(f"max_parallel must be at least 1, not {max_parallel}")
        self.default_role = default_role
        self.budget = budget
        self.max_parallel = max_parallel
        self.health = health if health is not None else WorkerHealth()
        self.backoff_s = backoff_s
        self.min_output_tokens = min_output_tokens
        self._sleep = sleep
        self._adapters = {framing: WorkerPromptAdapter(framing) for framing in WorkerPromptAdapter.FRAMINGS}

    def run(
        self,
        workflow: Workflow,
        question: str,
        budget: Budget | None = None,
        *,
        conductor_usage: Usage = Usage(),
    ) -> RunResult:
        """``arun`` from sync code: in this thread's event loop, or on a daemon thread when one is running here."""
        return _threads.run_sync(self.arun(workflow, question, budget, conductor_usage=conductor_usage))

    async def arun(
        self,
        workflow: Workflow,
        question: str,
        budget: Budget | None = None,
        *,
        conductor_usage: Usage = Usage(),
    ) -> RunResult:
        """Run ``workflow`` (already validated against this pool) on ``question``. ``conductor_usage`` is what the
        conductor LM spent on this run (writing ``workflow``): the budget counts from it, and the result includes it.

        Under a cost budget, a run whose workflow may reach a worker of unknown price (``Worker.price`` is ``None``)
        calls nobody and ends with a budget error naming it."""
        budget = budget or self.budget
        tracer = _tracing.tracer
        if tracer is None:
            return await self._run(workflow, question, budget, conductor_usage)
        return await _tracing.traced_run(tracer, lambda: self._run(workflow, question, budget, conductor_usage))

    async def _run(self, workflow: Workflow, question: str, budget: Budget, conductor_usage: Usage) -> RunResult:
        ledger = Ledger(budget, self.min_output_tokens, conductor_usage)
        try:
            for worker in self._reachable(workflow):
                ledger.price(worker)
        except BudgetExceeded as exc:
            return RunResult(None, [], RunError("budget", str(exc)), workflow, conductor_usage)
        waiting = deque(range(len(workflow)))
        started: dict[int, _Step] = {}
        answered: set[int] = set()
        problems: list[tuple[int, RunError]] = []  # (step, why the run stops): once there is one, no step starts
        running: dict[asyncio.Task[None], _Step] = {}
        try:
            while True:
                for index in [] if problems else self._ready(workflow, waiting, answered, len(running)):
                    try:
                        step = self._prepare(workflow, index, question, started, ledger)
                    except BudgetExceeded as exc:
                        problems.append((index, RunError("budget", f"step {index} not run: {exc}")))
                        break
                    started[index] = step
                    running[asyncio.create_task(self._run_step(step, ledger))] = step  # in a copy of the context
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raises what escaped a step: a bug, not a worker failure
                    step = running.pop(task)
                    if step.failure is None:
                        answered.add(step.trace.index)
                    else:
                        problems.append((step.trace.index, step.failure))
        finally:  # a bug escaped a step, or the run was cancelled: no step outlives its run
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

        steps = [started[index] for index in sorted(started)]
        if dspy.settings.trace is not None:  # let DSPy optimizers see worker steps like any predictor call
            for step in steps:
                if step.trace.error is None:
                    output = dspy.Prediction(**{_output_field(step.predictor): step.trace.output})
                    dspy.settings.trace.append((step.predictor, step.inputs, output))
        result = RunResult(None, [step.trace for step in steps], workflow=workflow, conductor_usage=conductor_usage)
        if problems:
            result.error = min(problems, key=lambda problem: problem[0])[1]  # the first in workflow order
        elif result.steps:
            result.answer = result.steps[-1].output
        return result

    def _reachable(self, workflow: Workflow) -> set[Worker]:
        """Every worker a step of ``workflow`` may call: the ones it names and their fallbacks."""
        names = {self.pool[step.worker].name for step in workflow.steps}
        names |= {other for name in names for other in self.pool.fallbacks.get(name, ())}
        return {worker for worker in self.pool if worker.name in names}

    def _ready(self, workflow: Workflow, waiting: deque[int], answered: set[int], running: int) -> list[int]:
        """Take from ``waiting`` the steps that may start now: in workflow order, while every step each one sees is
        answered and fewer than ``max_parallel`` run."""
        ready = []
        while waiting and running + len(ready) < self.max_parallel and set(workflow.visible(waiting[0])) <= answered:
            ready.append(waiting.popleft())
        return ready

    # ---- one step ------------------------------------------------------------------------------------------------
    def _prepare(
        self, workflow: Workflow, index: int, question: str, started: dict[int, _Step], ledger: Ledger
    ) -> _Step:
        """Build step ``index``'s prompt, pick the workers it may try and reserve the budget of the first."""
        step = workflow.steps[index]
        role = step.role or self.default_role
        trace = StepTrace(index, step.worker, self.pool[step.worker].name, role, step.subtask, workflow.visible(index))
        predictor = self.roles[role]
        context = _context([started[j].trace for j in trace.visible])
        offered = {"question": question, "context": context, "subtask": step.subtask}
        fields = predictor.signature.input_fields  # a computed property: read it once
        inputs = {k: v for k, v in offered.items() if k in fields}
        workers, notes = route(self.pool, self.health, step.worker)
        messages = self._messages(predictor, inputs, workers[0] if workers else self.pool[step.worker])
        hold = self._reserve(ledger, workers[0], trace, messages) if workers else None
        return _Step(trace, predictor, inputs, messages, workers, notes, hold)

    def _messages(self, predictor: dspy.Predict, inputs: dict[str, str], worker: Worker) -> Messages:
        """The prompt of a step with role ``predictor`` and ``inputs``, in ``worker``'s framing."""
        return self._adapters[worker.framing].format(predictor.signature, predictor.demos, inputs)

    def _reserve(self, ledger: Ledger, worker: Worker, trace: StepTrace, messages: Messages) -> Hold:
        # Counting runs a tokenizer (litellm's, for an API model), a tenth of a millisecond a step: only where a
        # limit needs it. The trace's count is replaced by what the call reports once it returns.
        trace.prompt_tokens = worker.count_tokens(messages) if ledger.counts_prompts else 0
        return ledger.reserve(worker, trace.index, trace.prompt_tokens)

    async def _run_step(self, step: _Step, ledger: Ledger) -> None:
        tracer = _tracing.tracer
        if tracer is None:
            await self._step_with_callbacks(step, ledger)
        else:
            await _tracing.traced_step(tracer, step.trace, lambda: self._step_with_callbacks(step, ledger))

    async def _step_with_callbacks(self, step: _Step, ledger: Ledger) -> None:
        """Run the step as DSPy callbacks (``dspy.settings.callbacks``, MLflow's autolog) see a call of its role's
        predictor: the step's inputs in, its response out, or the reason no worker answered as the exception. The
        worker's own LM or tool call is an event inside it."""

        # Named as DSPy's callback wrapper expects: it passes on the arguments but ``instance``, as for Module.__call__.
        async def role_step(instance: dspy.Predict, **kwargs: str) -> dspy.Prediction:
            await self._try_workers(step, ledger)
            if step.trace.output is None and step.failure is not None:
                raise _StepFailed(step.failure.message)
            return dspy.Prediction(**{_output_field(instance): step.trace.output})

        with contextlib.suppress(_StepFailed):
            await with_callbacks(role_step)(step.predictor, **step.inputs)

    async def _try_workers(self, step: _Step, ledger: Ledger) -> None:
        """Ask the step's workers in turn until one answers; record who answered, or why none did."""
        trace, hold, notes = step.trace, step.hold, list(step.notes)
        started = time.perf_counter()
        for worker in step.workers:
            if hold is None:  # a fallback: it needs its own prompt (its framing may differ) and reservation
                step.messages = self._messages(step.predictor, step.inputs, worker)
                try:
                    hold = self._reserve(ledger, worker, trace, step.messages)
                except BudgetExceeded as exc:
                    notes.append(f"{worker.name} does not fit the budget: {exc}")
                    continue
            try:
                completion = await self._call_with_retries(worker, step, hold.max_tokens)
            except WorkerError as exc:
                ledger.settle(hold)
                hold = None
                notes.append(str(exc) if worker.name in str(exc) else f"{worker.name}: {exc}")
                continue
            trace.latency_s = time.perf_counter() - started
            trace.prompt_tokens, trace.completion_tokens = completion.input_tokens, completion.output_tokens
            trace.cost = (
                completion.cost
                if completion.cost is not None
                else ledger.price(worker).cost(completion.input_tokens, completion.output_tokens)
            )
            overrun = ledger.settle(hold, completion, trace.cost)
            parsed = self._adapters[worker.framing].parse(step.predictor.signature, completion.text)
            trace.output = parsed[_output_field(step.predictor)]
            trace.answered_by = worker.name
            trace.fallback_reason = "; ".join(notes) or None
            if notes:
                logger.info("step %d: %s answered for %s (%s)", trace.index, worker.name, trace.worker, notes[-1])
            if overrun is not None:
                trace.error = f"{worker.name} {overrun}"
                step.failure = RunError("budget", f"step {trace.index} went over its reservation: {trace.error}")
            return
        trace.latency_s = time.perf_counter() - started
        trace.prompt_tokens = 0  # what the budget counts for calls that failed: their reservations were given back
        trace.error = "; ".join(notes)
        step.failure = RunError(
            "execution", f"step {trace.index} ({trace.worker}) failed after {trace.attempts} attempts: {trace.error}"
        )

    async def _call_with_retries(self, worker: Worker, step: _Step, max_tokens: int) -> Completion:
        """Call ``worker`` on ``step`` until it answers, its retries are spent, or it is cooled down; errors that
        would repeat are not retried. Every call's outcome goes into the pool's health record."""
        trace = step.trace
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_any(
                tenacity.stop_after_attempt(worker.retries + 1),
                lambda _: self.health.cooldown_left(worker.name) > 0,
            ),
            wait=tenacity.wait_exponential_jitter(initial=self.backoff_s, max=30 * self.backoff_s),
            retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, WorkerError) and exc.retryable),
            sleep=self._wait,
            reraise=True,
            before_sleep=lambda state: logger.warning(
                "%s failed (attempt %d): %s", worker.name, state.attempt_number, state.outcome.exception()
            ),
        )
        async for attempt in retrying:
            with attempt:
                trace.attempts += 1
                try:
                    async with worker.limits.turn():  # the wait for a turn is not part of the call's timeout
                        completion = await _call_with_timeout(worker, step, max_tokens)
                except WorkerError as exc:
                    if exc.retryable:  # an error that would repeat says nothing about the worker's health
                        self.health.record_failure(worker.name)
                    raise
                self.health.record_success(worker.name)
                return completion
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _wait(self, seconds: float) -> None:
        """Wait ``seconds`` before a retry with ``sleep``, awaited if it is a coroutine function."""
        waited = self._sleep(seconds)
        if inspect.isawaitable(waited):
            await waited


async def _call_with_timeout(worker: Worker, step: _Step, max_tokens: int) -> Completion:
    """The worker's answer to ``step``, given up on after the worker's timeout (``WorkerTimeout``). A blocking call
    runs on a daemon thread that a hung call keeps (it can't be killed; daemon: it won't keep the process alive);
    tools that run code kill their own process. Whatever else the call raises fails the step, never the run."""
    deadline = asyncio.timeout(worker.timeout_s)
    try:
        async with deadline:
            return await worker.acomplete_step(
                step.inputs, step.messages, max_tokens=max_tokens, temperature=worker.temperature
            )
    except (WorkerError, asyncio.CancelledError):  # cancelled: the run itself is being stopped
        raise
    except BaseException as exc:  # the call's own, even SystemExit: it ends the step, never the caller's thread
        if deadline.expired():
            raise WorkerTimeout(f"{worker.name} did not answer within {worker.timeout_s:g} s") from None
        raise WorkerError(f"{worker.name}: {type(exc).__name__}: {exc}") from exc


class _StepFailed(Exception):
    """No worker answered a step: what DSPy callbacks get as the step's exception (the run records it, not raises)."""


def _context(steps: list[StepTrace]) -> str:
    """The visible earlier steps as the worker sees them: each one's subtask and response."""
    return "\n\n".join(
        f"Step {s.index} (Model {s.worker_index}) subtask: {s.subtask}\n"
        f"Step {s.index} (Model {s.worker_index}) response:\n{s.output}"
        for s in steps
    )


def _output_field(predictor: dspy.Predict) -> str:
    return next(iter(predictor.signature.output_fields))
