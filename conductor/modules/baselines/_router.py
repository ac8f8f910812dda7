"""``OneStepRouter``: the Conductor restricted to one step, i.e. a router that picks a single worker.

It separates what the Conductor gains from choosing *whom* to ask from what it gains from writing multi-step
workflows. (The untrained prompted conductor is ``Conductor`` itself.)
"""

from __future__ import annotations

from typing import Any

import dspy

from conductor.modules.pool import WorkerPool
from conductor.modules.programs import Conductor

ROUTER_INSTRUCTIONS = """You are the router of a team of worker models. You never answer the task yourself. You \
pick the single worker most likely to answer this task correctly and write a workflow of exactly one step for it.

Rules:
- Write exactly one step: `model_id` holds one worker number, `subtasks` one instruction, `access_list` is [[]].
- The subtask is a clear, self-contained instruction that asks for the complete final answer in the form the task
  needs.
- Give code to run to a code-running worker inside a fenced block, and arithmetic to a calculator as a plain
  expression."""


class OneStepRouter(Conductor):
    """A ``Conductor`` with ``max_steps=1`` whose instructions say to pick the single best worker. A workflow of more
    steps is a format error (handled like any other: the fallback answers and the error is recorded).
    Other arguments are those of ``Conductor``."""

    def __init__(self, pool: WorkerPool, lm: dspy.LM | None = None, **kwargs: Any):
        super().__init__(pool, lm, max_steps=1, **kwargs)
        self.orchestrate.signature = self.orchestrate.signature.with_instructions(ROUTER_INSTRUCTIONS)
