"""``RandomWorkflow``: a uniformly random valid workflow per question, the floor a conductor has to beat."""

from __future__ import annotations

import hashlib
import random
from typing import Unpack

from conductor.errors import ConfigError
from conductor.modules.baselines._base import WorkflowProgram
from conductor.modules.pool import WorkerPool
from conductor.modules.programs import ProgramOptions
from conductor.modules.workflow import Step, Workflow

WORK = "Work on the task; give your answer."
WORK_FINAL = "Work on the task; give the final answer."


class RandomWorkflow(WorkflowProgram):
    """For each question: 1 to ``max_steps`` steps (uniform), each with a uniform random worker and access
    ``"all"`` or ``[]`` (even odds), a generic subtask, and the last step asked for the final answer.

    The draw depends only on ``seed`` and the question text, so a question gets the same workflow in every run,
    process and thread, whatever order the questions come in.
    """

    def __init__(self, pool: WorkerPool, max_steps: int = 5, seed: int = 0, **options: Unpack[ProgramOptions]):
        if max_steps < 1:
            raise ConfigError(f"RandomWorkflow needs max_steps >= 1, not {max_steps}")
        super().__init__(pool, **options)
        self.max_steps = max_steps
        self.seed = seed

    def workflow_for(self, question: str) -> Workflow:
        digest = hashlib.sha256(f"{self.seed}\0{question}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        n = rng.randint(1, self.max_steps)
        return Workflow(
            tuple(
                Step(rng.randrange(len(self.pool)), WORK_FINAL if i == n - 1 else WORK, rng.choice(("all", ())))
                for i in range(n)
            )
        )
