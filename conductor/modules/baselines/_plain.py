"""``PlainChat``: one model called as a user would call it without this library (the "plain chat" baseline)."""

from __future__ import annotations

from typing import Unpack

from conductor.errors import ConfigError
from conductor.modules.baselines._single import SingleWorker
from conductor.modules.pool import WorkerPool
from conductor.modules.programs import ProgramOptions


class PlainChat(SingleWorker):
    """Worker ``worker`` answers the question sent alone as the only user message: no system message, no role
    instructions, no preamble or titles (the single worker's step under the ``"plain"`` framing). Its calls, tokens
    and cost are counted as every method's are. A tool has no chat to call: refused with a ``ConfigError``."""

    def __init__(self, pool: WorkerPool, worker: int = 0, **options: Unpack[ProgramOptions]):
        if not 0 <= worker < len(pool):
            raise ConfigError(f"PlainChat: worker {worker} is not in the pool of {len(pool)} workers")
        super().__init__(pool.framed({pool.names[worker]: "plain"}), worker, **options)
