"""``SingleWorker``: one worker answers the question directly (the "best single model" baseline)."""

from __future__ import annotations

from typing import Unpack

from conductor.modules.baselines._pipeline import FixedPipeline
from conductor.modules.pool import WorkerPool
from conductor.modules.programs import DIRECT_SUBTASK, ProgramOptions


class SingleWorker(FixedPipeline):
    """Worker ``worker`` answers in one step that sees nothing else, under the default role; this is the same step
    the Conductor falls back to when its workflow is unusable."""

    def __init__(self, pool: WorkerPool, worker: int = 0, **options: Unpack[ProgramOptions]):
        super().__init__(pool, [(worker, "", DIRECT_SUBTASK, [])], **options)
