"""``MixtureOfAgents``: several proposers answer independently, one aggregator combines them (one layer, as the
Conductor paper ran it: 7 proposers and an aggregator make its 8 calls)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from conductor.errors import ConfigError
from conductor.modules.baselines._pipeline import FixedPipeline
from conductor.modules.pool import WorkerPool
from conductor.modules.programs import DIRECT_SUBTASK, ProgramOptions

AGGREGATE = "Combine the candidate responses above into one final response. Give the final answer."


class MixtureOfAgents(FixedPipeline):
    """Each of ``proposers`` (default: every worker of the pool) answers seeing nothing; then ``aggregator`` takes
    the ``aggregate`` role, sees every proposal and gives the answer."""

    def __init__(
        self,
        pool: WorkerPool,
        proposers: Sequence[int] | None = None,
        aggregator: int = 0,
        **options: Unpack[ProgramOptions],
    ):
        proposers = range(len(pool)) if proposers is None else proposers
        if not proposers:
            raise ConfigError("MixtureOfAgents needs at least one proposer")
        steps = [(p, "", DIRECT_SUBTASK, []) for p in proposers]
        super().__init__(pool, [*steps, (aggregator, "aggregate", AGGREGATE, "all")], **options)
