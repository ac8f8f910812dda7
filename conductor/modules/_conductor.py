"""``Conductor``: a DSPy module that writes a workflow for each input and runs it over a worker pool."""

from __future__ import annotations

import logging
from typing import Any, Literal, Unpack

import dspy
from dspy.utils.exceptions import AdapterParseError

from conductor.errors import ConfigError, WorkflowError
from conductor.modules._executor import RunError, RunResult
from conductor.modules._pool import WorkerPool
from conductor.modules._program import DIRECT_SUBTASK, PoolProgram, ProgramOptions
from conductor.modules._prompts import WorkflowAdapter
from conductor.modules._workflow import Limits, Step, Workflow
from conductor.signatures import Orchestrate

logger = logging.getLogger(__name__)

Fallback = Literal["first_worker", "none"]


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
        question = self._question(inputs)
        if isinstance(question, RunError):
            return self._prediction(RunResult(answer=None, error=question), None, "")
        workflow, text, format_error = self.plan(question)
        if workflow is None:
            workflow = self._fallback_workflow()
            if workflow is None:
                return self._prediction(RunResult(answer=None, error=format_error), None, text)
        result = self.executor.run(workflow, question)
        if format_error is not None:
            result.error = format_error  # the fallback answered, but the conductor's own workflow was unusable
        return self._prediction(result, workflow, text)

    def plan(self, question: str) -> tuple[Workflow | None, str, RunError | None]:
        """Ask the conductor LM for a workflow: ``(workflow, raw_text, None)``, or ``(None, raw_text, error)``."""
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
                return None, exc.lm_response, RunError("format", str(exc.__cause__ or exc))
        try:
            workflow = Workflow.from_lists(
                out.model_id, out.subtasks, out.access_list, out.roles or None, reasoning=out.reasoning or ""
            ).validate(len(self.pool), self.limits, set(self.roles))
        except WorkflowError as exc:
            return None, adapter.completion, RunError("format", str(exc))
        return workflow, adapter.completion, None

    # ---- helpers ----
    def _fallback_workflow(self) -> Workflow | None:
        if self.fallback == "none":
            return None
        return Workflow((Step(0, DIRECT_SUBTASK, ()),))
