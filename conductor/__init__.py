"""dspy-conductor: a trainable conductor LM that writes and runs workflows over a pool of workers."""
# ruff: noqa: E402 - the imports follow the offline import of litellm below, which must come first

import os
import sys


def _import_litellm_offline() -> None:
    """Import litellm with its packaged price table: otherwise it downloads one when imported, which stalls on an
    offline machine (many clusters are). The setting holds for that import only, so the user's process keeps its
    environment (and litellm, if the user imported it first, its own table)."""
    if "litellm" in sys.modules:
        return
    name, before = "LITELLM_LOCAL_MODEL_COST_MAP", os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP")
    os.environ.setdefault(name, "True")
    try:
        import litellm  # noqa: F401
    finally:
        if before is None:
            del os.environ[name]


_import_litellm_offline()

import conductor.local  # noqa: F401 - registers the "local" worker kind of pool configs
from conductor._version import __version__
from conductor.deploy import load, save
from conductor.errors import (
    BudgetExceeded,
    ConductorError,
    ConfigError,
    MissingDependency,
    WorkerError,
    WorkerTimeout,
    WorkflowError,
)
from conductor.modules import (
    Budget,
    Completion,
    Conductor,
    ConductorConfig,
    Executor,
    Limits,
    LMWorker,
    Price,
    RunError,
    Step,
    StepTrace,
    Worker,
    WorkerHealth,
    WorkerPool,
    Workflow,
    disable_tracing,
    enable_tracing,
    render_trace_html,
)
from conductor.optimizers import ConductorCompiler

__all__ = [
    "Budget",
    "BudgetExceeded",
    "Completion",
    "Conductor",
    "ConductorCompiler",
    "ConductorConfig",
    "ConductorError",
    "ConfigError",
    "Executor",
    "LMWorker",
    "Limits",
    "MissingDependency",
    "Price",
    "RunError",
    "Step",
    "StepTrace",
    "Worker",
    "WorkerError",
    "WorkerHealth",
    "WorkerPool",
    "WorkerTimeout",
    "Workflow",
    "WorkflowError",
    "__version__",
    "disable_tracing",
    "enable_tracing",
    "load",
    "render_trace_html",
    "save",
]
