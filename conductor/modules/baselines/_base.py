"""``WorkflowProgram``: a method that writes its workflow by a fixed rule instead of asking a conductor LM."""

from __future__ import annotations

import abc
from typing import Any

import dspy

from conductor.errors import ConfigError, WorkflowError
from conductor.modules.programs import PoolProgram
from conductor.modules.run import RunError, RunResult
from conductor.modules.workflow import Limits, Workflow


class _AbstractModuleMeta(type(dspy.Module), abc.ABCMeta):
    """``dspy.Module``'s metaclass with ``abc``'s, so a module can have abstract methods."""


class WorkflowProgram(PoolProgram, metaclass=_AbstractModuleMeta):
    """Runs ``workflow_for(question)`` through the project's ``Executor``, so retries, budgets and traces are those
    of the Conductor, and returns the same prediction fields (``conductor_text`` is ``""``)."""

    @abc.abstractmethod
    def workflow_for(self, question: str) -> Workflow:
        """The workflow to run on ``question``; every subclass defines it (one that doesn't can't be built)."""

    def forward(self, **inputs: Any) -> dspy.Prediction:
        question = self.question_text(inputs)
        if isinstance(question, RunError):
            return self.no_answer(question)
        workflow = self.workflow_for(question)
        return self.make_prediction(self._run(workflow, question), workflow)

    def _run(self, workflow: Workflow, question: str) -> RunResult:
        """Execute ``workflow``; a subclass may post-process the result (e.g. vote over the steps)."""
        return self.executor.run(workflow, question)

    def _checked(self, workflow: Workflow) -> Workflow:
        """``workflow`` if this program's pool and roles can run it, else a ``ConfigError`` naming every problem."""
        try:
            return workflow.validate(len(self.pool), Limits(max_steps=len(workflow)), set(self.roles))
        except WorkflowError as exc:
            raise ConfigError(f"{type(self).__name__}: {exc}") from None
