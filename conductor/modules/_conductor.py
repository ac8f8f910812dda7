"""``Conductor``: a DSPy module that writes a workflow for each input and runs it over a worker pool."""

from __future__ import annotations

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
from conductor.signatures import Orchestrate

logger = logging.getLogger(__name__)

Fallback = Literal["first_worker", "none"]


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

    Args:
        pool: the workers, addressed by index.
        lm: the conductor LM (any ``dspy.LM``); ``None`` uses ``dspy.settings.lm``.
        max_steps: the most steps a workflow may have (the paper used 5).
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
        fallback: Fallback = "first_worker",
        **options: Unpack[ProgramOptions],
    ):
        if fallback not in ("first_worker", "none"):
            raise ConfigError(f"fallback must be 'first_worker' or 'none', not {fallback!r}")
        # Set before the roles, so named_predictors() lists the conductor first.
        self.orchestrate = dspy.Predict(Orchestrate)
        self.orchestrate.lm = lm
        super().__init__(pool, **options)
        self.limits = Limits(max_steps=max_steps)
        self.fallback = fallback

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
        check: Callable[[Workflow, RunError | None], None] | None = None,
    ) -> dspy.Prediction:
        """Run what ``plan`` returned: the conductor's workflow, or the fallback when it was unusable.

        ``check`` sees the workflow about to run (and the format error, if it is the fallback) before any worker is
        called, and may raise to refuse it; a server uses it to enforce per-key permissions.
        """
        to_run = plan.workflow or self.fallback_workflow()
        if to_run is None:
            return self.make_prediction(RunResult(answer=None, error=plan.error), None, plan.text)
        if check is not None:
            check(to_run, plan.error)
        result = (executor or self.executor).run(to_run, question, budget)
        if plan.error is not None:
            result.error = plan.error  # the fallback answered, but the conductor's own workflow was unusable
        return self.make_prediction(result, to_run, plan.text)

    def plan(self, question: str) -> Plan:
        """Ask the conductor LM for a workflow; a format problem is returned in ``Plan.error``, never raised."""
        adapter = WorkflowAdapter()  # one per call: it keeps this call's raw completion, safe under concurrency
        with dspy.context(adapter=adapter):
            try:
                out = self.orchestrate(
                    question=question,
                    workers=self.pool.describe(),
                    available_roles=", ".join(self.roles),
                    max_steps=self.limits.max_steps,
                )
            except AdapterParseError as exc:
                return Plan(None, exc.lm_response, RunError("format", str(exc.__cause__ or exc)))
        try:
            workflow = Workflow.from_lists(
                out.model_id, out.subtasks, out.access_list, out.roles or None, reasoning=out.reasoning or ""
            ).validate(len(self.pool), self.limits, set(self.roles))
        except WorkflowError as exc:
            return Plan(None, adapter.completion, RunError("format", str(exc)))
        return Plan(workflow, adapter.completion, None)

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
