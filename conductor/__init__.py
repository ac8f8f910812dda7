"""dspy-conductor: a trainable conductor LM that writes and runs workflows over a pool of workers."""

import os

# litellm otherwise tries to download its price table at import time; these machines (and many clusters) are offline.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

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
