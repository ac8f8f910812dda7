"""``Conductor``: a DSPy module that writes a workflow for each input and runs it over a worker pool.

Recursion (the paper's recursive rounds): with ``max_depth > 0`` the conductor is offered to itself as one more
worker, after the pool's. Naming itself as the last step's worker runs the steps before it, then starts a round in
which the conductor sees its workflow and the answer, and keeps the answer (empty lists) or writes a new workflow,
which may name itself again while rounds are left.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, Unpack

import dspy
from dspy.utils.exceptions import AdapterParseError

from conductor.errors import ConfigError, WorkflowError
from conductor.modules._executor import Budget, Executor, RunError, RunResult
from conductor.modules._pool import WorkerPool
from conductor.modules._program import DIRECT_SUBTASK, PoolProgram, ProgramOptions
from conductor.modules._prompts import WorkflowAdapter
from conductor.modules._workflow import Limits, Step, Workflow
from conductor.signatures import Orchestrate, Revise

logger = logging.getLogger(__name__)

Fallback = Literal["first_worker", "none"]
Check = Callable[[Workflow, RunError | None], None]

SELF_DESCRIPTION = (
    "yourself, the conductor (only as the last step): review the final answer and rewrite the workflow if it is wrong"
)
"""How the conductor sees itself in the worker list while a recursive round is left."""


class Plan(NamedTuple):
    """The conductor's answer for one question: a runnable workflow, or ``None`` and the format ``error``."""

    workflow: Workflow | None
    text: str
    error: RunError | None


class Conductor(PoolProgram):
    """For each input, the conductor LM writes a workflow over ``pool``; the executor runs it.

    Returns the prediction every ``PoolProgram`` returns (the user's output field(s), ``workflow``, ``trace``,
    ``tokens``, ``cost``, ``response``, ``error``), with ``conductor_text`` holding the conductor's raw output.
    ``error.kind == "format"`` tells a workflow the conductor got wrong from a run that executed but failed.

    A run in several rounds (see the module docstring) returns the answer of the last round that gave one, with
    ``workflow`` the workflow that gave it, ``trace``, ``tokens`` and ``cost`` over all rounds, ``conductor_text``
    the first round's, ``error`` the last round's, and ``rounds``: one prediction per round, as the run would have
    returned had it stopped there, except that its ``trace``, ``tokens`` and ``cost`` are the round's own.

    Args:
        pool: the workers, addressed by index.
        lm: the conductor LM (any ``dspy.LM``); ``None`` uses ``dspy.settings.lm``.
        max_steps: the most steps a workflow may have (the paper used 5).
        max_depth: the most recursive rounds a run may add (0: the conductor can't choose itself).
        fallback: on an unusable workflow, ``"first_worker"`` asks worker 0 the question directly (recorded as a
            format error all the same); ``"none"`` returns no answer.
        **options: ``signature``, ``roles``, ``budget``, ``max_parallel``, ``max_question_chars`` (see ``PoolProgram``).
    """

    def __init__(
        self,
        pool: WorkerPool,
        lm: dspy.LM | None = None,
        *,
        max_steps: int = 5,
        max_depth: int = 0,
        fallback: Fallback = "first_worker",
        **options: Unpack[ProgramOptions],
    ):
        if fallback not in ("first_worker", "none"):
            raise ConfigError(f"fallback must be 'first_worker' or 'none', not {fallback!r}")
        # Set before the roles, so named_predictors() lists the conductor first.
        self.orchestrate = dspy.Predict(Orchestrate)
        self.orchestrate.lm = lm
        self.max_depth = max_depth
        super().__init__(pool, **options)
        self.limits = Limits(max_steps=max_steps)
        self.fallback = fallback

    @property
    def max_depth(self) -> int:
        """The most recursive rounds a run may add."""
        return self._max_depth

    @max_depth.setter
    def max_depth(self, depth: int) -> None:
        # The ``revise`` predictor exists only while it can be called, so a program without recursion saves, loads
        # and is optimized as before.
        if depth < 0:
            raise ConfigError(f"max_depth must be at least 0, not {depth}")
        self._max_depth = depth
        if depth and "revise" not in self.__dict__:
            self.revise = dspy.Predict(Revise)
        elif not depth:
            self.__dict__.pop("revise", None)

    @property
    def own_id(self) -> int:
        """The worker number by which the conductor chooses itself: the one after the pool's."""
        return len(self.pool)

    def forward(self, **inputs: Any) -> dspy.Prediction:
        question = self.question_text(inputs)
        if isinstance(question, RunError):
            return self.make_prediction(RunResult(answer=None, error=question), None, "")
        return self.run_plan(question, self.plan(question))

    def run_plan(
        self,
        question: str,
        plan: Plan,
        *,
        executor: Executor | None = None,
        budget: Budget | None = None,
        check: Check | None = None,
    ) -> dspy.Prediction:
        """Run what ``plan`` returned: the conductor's workflow, or the fallback when it was unusable; then the
        recursive rounds it asks for, all within ``budget``.

        ``check`` sees each workflow about to run (and the format error, if it is the fallback) before any worker is
        called, and may raise to refuse it; a server uses it to enforce per-key permissions.
        """
        executor = executor or self.executor
        budget = budget or executor.budget
        to_run = plan.workflow or self.fallback_workflow()
        if to_run is None:
            first = self.make_prediction(RunResult(answer=None, error=plan.error), None, plan.text)
        else:
            result = self._execute(to_run, question, executor, budget, check, plan.error)
            if plan.error is not None:
                result.error = plan.error  # the fallback answered, but the conductor's own workflow was unusable
            first = self.make_prediction(result, result.workflow, plan.text)
        rounds = [first]
        while self._calls_itself(plan.workflow):
            plan = self.replan(question, plan.workflow, rounds[-1], depth=len(rounds))
            spent = [step for done in rounds for step in done.trace]
            rounds.append(self._revision(question, plan, rounds[-1], executor, budget.remaining(spent), check))
        last = rounds[-1]
        steps = [step for done in rounds for step in done.trace]
        return self.make_prediction(
            RunResult(last.response, steps, last.error), last.workflow, first.conductor_text, rounds
        )

    def plan(self, question: str) -> Plan:
        """Ask the conductor LM for a workflow; a format problem is returned in ``Plan.error``, never raised."""
        return self._ask(self.orchestrate, 0, question=question)

    def replan(self, question: str, workflow: Workflow, previous: dspy.Prediction, depth: int) -> Plan:
        """Recursive round ``depth`` (1 the first): show the conductor its ``workflow`` and the ``previous`` answer
        it gave; an empty workflow keeps that answer. A format problem is returned in ``Plan.error``."""
        answer = previous.response if previous.response is not None else f"(no answer: {previous.error})"
        return self._ask(
            self.revise, depth, question=question, previous_workflow=workflow.to_text(), previous_answer=answer
        )

    def _ask(self, predictor: dspy.Predict, depth: int, **inputs: Any) -> Plan:
        """Ask the conductor LM through ``predictor`` in round ``depth`` (0: the first) and read a ``Plan`` from its
        output. Every predictor uses the conductor LM and sampling settings of ``orchestrate``."""
        adapter = WorkflowAdapter()  # one per call: it keeps this call's raw completion, safe under concurrency
        with dspy.context(adapter=adapter):
            try:
                out = predictor(
                    workers=self._workers_text(depth),
                    available_roles=", ".join(self.roles),
                    max_steps=self.limits.max_steps,
                    lm=self.orchestrate.lm,
                    config=self.orchestrate.config,
                    **inputs,
                )
            except AdapterParseError as exc:
                return Plan(None, exc.lm_response, RunError("format", str(exc.__cause__ or exc)))
        try:
            workflow = self._validated(
                Workflow.from_lists(
                    out.model_id, out.subtasks, out.access_list, out.roles or None, reasoning=out.reasoning or ""
                ),
                depth,
            )
        except WorkflowError as exc:
            return Plan(None, adapter.completion, RunError("format", str(exc)))
        return Plan(workflow, adapter.completion, None)

    def _workers_text(self, depth: int) -> str:
        """The worker list the conductor sees in round ``depth``: the pool, and itself while a round is left."""
        pool = self.pool.describe()
        return pool if depth >= self.max_depth else f"{pool}\nModel {self.own_id}: {SELF_DESCRIPTION}"

    def _validated(self, workflow: Workflow, depth: int) -> Workflow:
        """``workflow`` if it may run in round ``depth``, else a ``WorkflowError`` listing every problem. A
        recursive round may write no steps (keep the answer); the conductor may only be the last step's worker, after
        at least one other, while a round is left."""
        limits = dataclasses.replace(self.limits, allow_empty=depth > 0)
        n_workers = len(self.pool) + (1 if self.max_depth else 0)
        found = workflow.problems(n_workers, limits, set(self.roles))
        for i, step in enumerate(workflow.steps if self.max_depth else ()):
            if step.worker != self.own_id:
                continue
            me = f"step {i}: Model {step.worker} is you, the conductor"
            if i < len(workflow) - 1:
                found.append(f"{me}: you may only do the last step")
            elif i == 0:
                found.append(f"{me}: a worker must answer before you review the answer")
            elif depth >= self.max_depth:
                found.append(f"{me}, and no recursive round is left (max_depth={self.max_depth})")
        if found:
            raise WorkflowError(found)
        return workflow

    def _calls_itself(self, workflow: Workflow | None) -> bool:
        return bool(self.max_depth and workflow and workflow.steps[-1].worker == self.own_id)

    def _execute(
        self,
        workflow: Workflow,
        question: str,
        executor: Executor,
        budget: Budget,
        check: Check | None,
        format_error: RunError | None = None,
    ) -> RunResult:
        """Run ``workflow``'s worker steps (all but a last step naming the conductor)."""
        if self._calls_itself(workflow):
            workflow = Workflow(workflow.steps[:-1], workflow.reasoning)
        if check is not None:
            check(workflow, format_error)
        return executor.run(workflow, question, budget)

    def _revision(
        self,
        question: str,
        plan: Plan,
        previous: dspy.Prediction,
        executor: Executor,
        budget: Budget,
        check: Check | None,
    ) -> dspy.Prediction:
        """Run a recursive round's ``plan``. Its workflow's answer replaces the ``previous`` one; with no answer
        (kept, unusable, or a run that failed) the previous answer stands, and the round's error is recorded."""
        if plan.workflow is None:
            steps, error = [], plan.error
        elif not plan.workflow.steps:
            steps, error = [], previous.error
        else:
            result = self._execute(plan.workflow, question, executor, budget, check)
            if result.answer is not None:
                return self.make_prediction(result, result.workflow, plan.text)
            steps, error = result.steps, result.error
        return self.make_prediction(RunResult(previous.response, steps, error), previous.workflow, plan.text)

    def save(self, path, save_program: bool = False, modules_to_serialize=None, **manifest: Any) -> Any:
        """``path`` ending in ``.json`` or ``.pkl``: DSPy's own state file. Otherwise a deployable folder (manifest,
        pool config without secrets, prompts and demos, the conductor LM or its adapter) that
        ``conductor.load(path)`` and ``conductor serve path`` read; ``manifest`` adds entries (e.g. a Pareto point)."""
        if str(path).endswith((".json", ".pkl")):
            return super().save(path, save_program=save_program, modules_to_serialize=modules_to_serialize)
        from conductor.deploy import save_program as save_folder  # deploy builds on this module

        return save_folder(self, path, extra_manifest=manifest or None)

    def fallback_workflow(self) -> Workflow | None:
        """What runs when the conductor's workflow is unusable (``None``: nothing runs)."""
        if self.fallback == "none":
            return None
        return Workflow((Step(0, DIRECT_SUBTASK, ()),))
