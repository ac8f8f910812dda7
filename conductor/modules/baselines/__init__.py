"""Baselines the Conductor is measured against, as DSPy modules over the same ``WorkerPool``.

Each returns the Conductor's prediction fields and runs through the same ``Executor`` (retries, budgets, traces):

- ``SingleWorker``: one worker answers directly.
- ``PlainChat``: one model called with the question alone, as a user would call it without this library.
- ``SelfConsistency``: k samples of one worker, majority vote.
- ``MixtureOfAgents``: one layer of proposers, then an aggregator that sees them all.
- ``FixedPipeline``, ``plan_solve_verify``, ``solve_verify_refine``: the same workflow for every question.
- ``RandomWorkflow``: a random valid workflow per question (seeded).
- ``OneStepRouter``: the Conductor limited to one step.

The untrained, prompted conductor needs no baseline class: it is ``Conductor`` with an off-the-shelf LM.
"""

from conductor.modules.baselines._base import WorkflowProgram
from conductor.modules.baselines._mixture import MixtureOfAgents
from conductor.modules.baselines._pipeline import FixedPipeline, PipelineStep, plan_solve_verify, solve_verify_refine
from conductor.modules.baselines._plain import PlainChat
from conductor.modules.baselines._random import RandomWorkflow
from conductor.modules.baselines._router import OneStepRouter
from conductor.modules.baselines._self_consistency import SelfConsistency
from conductor.modules.baselines._single import SingleWorker

__all__ = [
    "FixedPipeline",
    "MixtureOfAgents",
    "OneStepRouter",
    "PipelineStep",
    "PlainChat",
    "RandomWorkflow",
    "SelfConsistency",
    "SingleWorker",
    "WorkflowProgram",
    "plan_solve_verify",
    "solve_verify_refine",
]
