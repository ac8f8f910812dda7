"""``Conductor``: a DSPy module that writes a workflow for each input and runs it over a worker pool."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import dspy
from dspy.utils.exceptions import AdapterParseError

from conductor.errors import ConfigError, WorkflowError
from conductor.modules._answer import extract_answer
from conductor.modules._executor import Budget, Executor, RunError, RunResult
from conductor.modules._pool import WorkerPool
from conductor.modules._prompts import WorkflowAdapter
from conductor.modules._workflow import Limits, Step, Workflow
from conductor.signatures import BUILTIN_ROLES, Orchestrate, role_name, role_problems

logger = logging.getLogger(__name__)

Fallback = Literal["first_worker", "none"]


class Conductor(dspy.Module):
    """For each input, the conductor LM writes a workflow over ``pool``; the executor runs it.

    The returned ``dspy.Prediction`` holds the user's output field(s), plus ``workflow``, ``trace`` (one
    ``StepTrace`` per step), ``tokens``, ``cost``, ``conductor_text`` and ``error`` (a ``RunError`` or ``None``;
    ``error.kind == "format"`` tells a workflow the conductor got wrong from a run that executed but failed).

    Args:
        pool: the workers, addressed by index.
        lm: the conductor LM (any ``dspy.LM``); ``None`` uses ``dspy.settings.lm``.
        signature: the user's task signature; its inputs make the question, its first output gets the answer.
        max_steps: the most steps a workflow may have (the paper used 5).
        roles: role signatures a step may take; the first is the default role.
        budget: per-run limits on steps, tokens and cost.
        fallback: on an unusable workflow, ``"first_worker"`` asks worker 0 the question directly (recorded as a
            format error all the same); ``"none"`` returns no answer.
        max_question_chars: longer questions are refused before any model is called.
    """

    def __init__(
        self,
        pool: WorkerPool,
        lm: dspy.LM | None = None,
        *,
        signature: str | type[dspy.Signature] = "question -> answer",
        max_steps: int = 5,
        roles: Sequence[type[dspy.Signature]] = BUILTIN_ROLES,
        budget: Budget = Budget(),
        fallback: Fallback = "first_worker",
        max_question_chars: int = 200_000,
    ):
        super().__init__()
        problems = [p for role in roles for p in role_problems(role)]
        if problems:
            raise ConfigError("; ".join(problems))
        if fallback not in ("first_worker", "none"):
            raise ConfigError(f"fallback must be 'first_worker' or 'none', not {fallback!r}")
        self.pool = pool
        self.signature = dspy.ensure_signature(signature)
        self.limits = Limits(max_steps=max_steps)
        self.fallback = fallback
        self.max_question_chars = max_question_chars
        # Predictors are built here, not in forward, so optimizers and save/load see them.
        self.orchestrate = dspy.Predict(Orchestrate)
        self.orchestrate.lm = lm
        self.roles = {role_name(role): dspy.Predict(role) for role in roles}
        self.executor = Executor(pool, self.roles, default_role=role_name(roles[0]), budget=budget)

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
        with dspy.context(adapter=WorkflowAdapter()):
            try:
                out = self.orchestrate(
                    question=question,
                    workers=self.pool.describe(),
                    available_roles=", ".join(self.roles),
                    max_steps=self.limits.max_steps,
                )
            except AdapterParseError as exc:
                return None, exc.lm_response, RunError("format", str(exc.__cause__ or exc))
        text = _last_completion(self.orchestrate)
        try:
            workflow = Workflow.from_lists(
                out.model_id, out.subtasks, out.access_list, out.roles or None, reasoning=out.reasoning or ""
            ).validate(len(self.pool), self.limits, set(self.roles))
        except WorkflowError as exc:
            return None, text, RunError("format", str(exc))
        return workflow, text, None

    # ---- helpers -------------------------------------------------------------------------------------------------
    def _question(self, inputs: dict[str, Any]) -> str | RunError:
        missing = [name for name in self.signature.input_fields if name not in inputs]
        if missing:
            return RunError("input", f"missing input field(s): {missing}")
        fields = {name: inputs[name] for name in self.signature.input_fields}
        if len(fields) == 1:
            question = str(next(iter(fields.values())))
        else:
            question = "\n".join(f"{name}: {value}" for name, value in fields.items())
        if not question.strip():
            return RunError("input", "the question is empty")
        if len(question) > self.max_question_chars:
            return RunError(
                "input", f"the question has {len(question):,} characters; the limit is {self.max_question_chars:,}"
            )
        return question

    def _fallback_workflow(self) -> Workflow | None:
        if self.fallback == "none":
            return None
        return Workflow((Step(0, "Answer the overall task directly and completely.", ()),))

    def _prediction(self, result: RunResult, workflow: Workflow | None, text: str) -> dspy.Prediction:
        outputs = {}
        for name, output in self.signature.output_fields.items():
            raw = result.answer or ""
            outputs[name] = extract_answer(raw, output.annotation) if raw else raw
        return dspy.Prediction(
            **outputs,
            workflow=workflow,
            trace=result.steps,
            tokens=result.tokens,
            cost=result.cost,
            response=result.answer,
            conductor_text=text,
            error=result.error,
        )


def _last_completion(predictor: dspy.Predict) -> str:
    """The conductor's raw text for the call just made (kept on the prediction for debugging and training)."""
    lm = predictor.lm or dspy.settings.lm
    try:
        return lm.history[-1]["outputs"][0] if lm and lm.history else ""
    except (KeyError, IndexError, TypeError):
        return ""
