"""``FixedPipeline``: the same workflow for every question, and two classic ones ready-made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from conductor.errors import ConfigError, WorkflowError
from conductor.modules.baselines._base import WorkflowProgram
from conductor.modules.pool import WorkerPool
from conductor.modules.programs import ProgramOptions
from conductor.modules.workflow import Workflow

PipelineStep = tuple[int, str, str] | tuple[int, str, str, str | Sequence[int]]
"""``(worker, role, subtask)`` or ``(worker, role, subtask, access)``. ``role`` ``""`` is the default role;
``access`` is ``"all"`` (the default: every earlier step), ``[]`` (none) or a list of earlier step indices."""

PLAN = "Write a short numbered plan for solving the overall task. Do not solve it."
SOLVE_WITH_PLAN = "Follow the plan and solve the overall task. Give the final answer."
VERIFY_PLAN_AND_SOLUTION = (
    "Check the plan and the solution: recompute results, test edge cases, look for wrong assumptions. "
    "Give the final answer you stand behind."
)
SOLVE = "Solve the overall task. Give the final answer."
VERIFY_SOLUTION = (
    "Check the solution above: recompute results, test edge cases, look for wrong assumptions. "
    "Say what is wrong, if anything, and give the final answer you stand behind."
)
REFINE = "Improve the solution using the check of it. Give the complete improved solution and the final answer."


class FixedPipeline(WorkflowProgram):
    """Runs the workflow ``steps`` on every question; the answer is the last step's response.

    The workflow is validated against the pool and roles when the program is built, so a typo fails at once.
    Keyword options (``signature``, ``roles``, ``budget``, ``max_question_chars``) are those of ``PoolProgram``.
    """

    def __init__(self, pool: WorkerPool, steps: Sequence[PipelineStep], **options: Unpack[ProgramOptions]):
        super().__init__(pool, **options)
        if any(len(step) not in (3, 4) for step in steps):
            raise ConfigError("each pipeline step is (worker, role, subtask) or (worker, role, subtask, access)")
        try:
            workflow = Workflow.from_lists(
                [step[0] for step in steps],
                [step[2] for step in steps],
                [step[3] if len(step) == 4 else "all" for step in steps],
                [step[1] for step in steps],
            )
        except WorkflowError as exc:
            raise ConfigError(f"{type(self).__name__}: {exc}") from None
        self.workflow = self._checked(workflow)

    def workflow_for(self, question: str) -> Workflow:
        return self.workflow


def plan_solve_verify(
    pool: WorkerPool, planner: int, solver: int, verifier: int, **options: Unpack[ProgramOptions]
) -> FixedPipeline:
    """Plan (seeing nothing), solve following the plan, then verify plan and solution and answer."""
    steps = [
        (planner, "plan", PLAN, []),
        (solver, "solve", SOLVE_WITH_PLAN),
        (verifier, "verify", VERIFY_PLAN_AND_SOLUTION),
    ]
    return FixedPipeline(pool, steps, **options)


def solve_verify_refine(
    pool: WorkerPool, solver: int, verifier: int, refiner: int, **options: Unpack[ProgramOptions]
) -> FixedPipeline:
    """Solve (seeing nothing), check the solution, then improve it using the check and answer."""
    steps = [(solver, "solve", SOLVE, []), (verifier, "verify", VERIFY_SOLUTION), (refiner, "refine", REFINE)]
    return FixedPipeline(pool, steps, **options)
