"""Ray, the engine that spreads scoring and GRPO rollouts over processes and machines: connecting to a cluster, the
options every actor or task runs with, and shipping a saved folder (a program, a policy) to processes that may be on
another machine.

Ray is optional (``pip install 'dspy-conductor[ray]'``): nothing imports it until a run asks for it.
"""

from __future__ import annotations

import itertools
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from conductor.errors import MissingDependency

logger = logging.getLogger(__name__)
T = TypeVar("T")

INSTALL_HINT = "pip install 'dspy-conductor[ray]'"
ONE_THREAD = {"num_cpus": 1, "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}}
"""Options of every actor and task: one CPU, and torch (which reads these at import) on one thread, so that N of
them use N cores instead of fighting over them."""


def require_ray() -> Any:
    """The ``ray`` module; ``MissingDependency`` naming the extra to install when it isn't there."""
    try:
        import ray
    except ImportError as exc:
        raise MissingDependency(f"running on Ray needs ray: {INSTALL_HINT} ({exc})") from exc
    return ray


def connect(address: str) -> Any:
    """The ``ray`` module, connected: to the cluster at ``address`` (``auto``: the one ``ray start`` runs on this
    machine; ``local``: a new one in this process; ``ray://host:10001``: a remote one), unless this process is
    connected already (then that connection is used, whatever ``address`` says)."""
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING)
        logger.info("connected to Ray at %s: %s", address, ray.cluster_resources())
    return ray


def cpus(ray: Any) -> int:
    """The cluster's CPUs: how many one-CPU actors run at once."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def consecutive_shards(items: Sequence[T], count: int) -> list[list[T]]:
    """``items`` in ``count`` consecutive shards of (almost) equal size, fewer when there are fewer items (one empty
    shard when there are none): a split that depends on the items and ``count`` only, not on who runs the shards."""
    count = max(1, min(count, len(items)))
    bounds = [len(items) * k // count for k in range(count + 1)]
    return [list(items[start:end]) for start, end in itertools.pairwise(bounds)]


def pack_folder(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path: a saved folder in a form Ray ships to any machine."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def unpack_folder(files: dict[str, bytes]) -> Path:
    """Write ``pack_folder``'s files into a new temporary folder of this process and return it."""
    folder = Path(tempfile.mkdtemp(prefix="conductor-ray-"))
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder
