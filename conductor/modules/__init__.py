"""Workflows, workers and pools, the executor and the Conductor module, each idea in its own room:

- ``workflow``: the workflow language (``Workflow``, its text format's vocabulary) and the prompts made of it;
- ``workers``: the ``Worker`` contract, the LM worker and plain wrappers (tools, DSPy modules, replay);
- ``tools``: the built-in tool workers (calculator, sandboxed Python, vote, check);
- ``pool``: ``WorkerPool`` and failover;
- ``run``: a run's value types (``Budget``, ``RunResult``, ...), the ``Executor`` and tracing;
- ``programs``: ``PoolProgram``, the ``Conductor`` and its config; ``baselines``: the fixed-workflow methods.

Rooms import only the rooms listed before them (baselines last); answer extraction (``_answer.py``) and the daemon
threads blocking calls run on (``_threads.py``) sit below all.
"""

from conductor.modules._answer import (
    bare_answer,
    choice_index,
    extract_answer,
    format_options,
    normalise,
    option_labels,
)
from conductor.modules.pool import (
    BUILTIN_TOOLS,
    WorkerBuilder,
    WorkerHealth,
    WorkerPool,
    WorkerSpec,
    register_worker_kind,
)
from conductor.modules.programs import (
    SELF_NAME,
    AskRevision,
    Conductor,
    ConductorConfig,
    ConductorReply,
    PoolProgram,
    WorkerIds,
)
from conductor.modules.run import (
    Budget,
    Executor,
    RunError,
    RunResult,
    StepTrace,
    Usage,
    disable_tracing,
    enable_tracing,
    render_trace_html,
)
from conductor.modules.tools import run_python
from conductor.modules.workers import (
    Completion,
    LMWorker,
    Messages,
    ModuleWorker,
    Price,
    ReplayStore,
    ReplayWorker,
    ToolWorker,
    Worker,
    as_worker,
    chat_request,
)
from conductor.modules.workflow import Limits, Step, WorkerPromptAdapter, Workflow, WorkflowAdapter

__all__ = [
    "BUILTIN_TOOLS",
    "SELF_NAME",
    "AskRevision",
    "Budget",
    "Completion",
    "Conductor",
    "ConductorConfig",
    "ConductorReply",
    "Executor",
    "LMWorker",
    "Limits",
    "Messages",
    "ModuleWorker",
    "PoolProgram",
    "Price",
    "ReplayStore",
    "ReplayWorker",
    "RunError",
    "RunResult",
    "Step",
    "StepTrace",
    "ToolWorker",
    "Usage",
    "Worker",
    "WorkerBuilder",
    "WorkerHealth",
    "WorkerIds",
    "WorkerPool",
    "WorkerPromptAdapter",
    "WorkerSpec",
    "Workflow",
    "WorkflowAdapter",
    "as_worker",
    "bare_answer",
    "chat_request",
    "choice_index",
    "disable_tracing",
    "enable_tracing",
    "extract_answer",
    "format_options",
    "normalise",
    "option_labels",
    "register_worker_kind",
    "render_trace_html",
    "run_python",
]
