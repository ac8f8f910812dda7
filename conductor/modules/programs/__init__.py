"""The programs that answer a user's signature over a worker pool: ``PoolProgram`` (what every such method shares),
the ``Conductor`` (a DSPy module whose LM writes each workflow) and ``ConductorConfig`` (its options, listed once)."""

from conductor.modules.programs._conductor import SELF_NAME, AskRevision, Conductor, ConductorReply
from conductor.modules.programs._config import ConductorConfig, WorkerIds
from conductor.modules.programs._program import PoolProgram, ProgramOptions
from conductor.modules.workflow import DIRECT_SUBTASK, QUESTION_ALONE

__all__ = [
    "DIRECT_SUBTASK",
    "QUESTION_ALONE",
    "SELF_NAME",
    "AskRevision",
    "Conductor",
    "ConductorConfig",
    "ConductorReply",
    "PoolProgram",
    "ProgramOptions",
    "WorkerIds",
]
