"""The worker pool: the ordered team of workers a conductor addresses (built in code or from a config, with the
worker kinds a config can name), and failover: each worker's health record and the order to try its fallbacks in."""

from conductor.modules.pool._failover import WorkerHealth, route
from conductor.modules.pool._pool import (
    BUILTIN_TOOLS,
    PoolSpec,
    WorkerBuilder,
    WorkerPool,
    WorkerSpec,
    register_worker_kind,
)

__all__ = [
    "BUILTIN_TOOLS",
    "PoolSpec",
    "WorkerBuilder",
    "WorkerHealth",
    "WorkerPool",
    "WorkerSpec",
    "register_worker_kind",
    "route",
]
