"""Workflows, workers and pools, the executor and the Conductor module."""

from conductor.modules._answer import (
    bare_answer,
    choice_index,
    extract_answer,
    format_options,
    normalise,
    option_labels,
)
from conductor.modules._conductor import SELF_NAME, AskRevision, Conductor, ConductorReply
from conductor.modules._config import ConductorConfig, WorkerIds
from conductor.modules._executor import Budget, Executor, RunError, RunResult, StepTrace, Usage
from conductor.modules._failover import WorkerHealth
from conductor.modules._pool import BUILTIN_TOOLS, WorkerBuilder, WorkerPool, WorkerSpec, register_worker_kind
from conductor.modules._program import PoolProgram
from conductor.modules._prompts import WorkerPromptAdapter, WorkflowAdapter
from conductor.modules._sandbox import run_python
from conductor.modules._tools import ModuleWorker, ToolWorker, as_worker
from conductor.modules._tracing import disable_tracing, enable_tracing, render_trace_html
from conductor.modules._worker import Completion, LMWorker, Messages, Price, Worker, chat_request
from conductor.modules._workflow import Limits, Step, Workflow

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
