"""Workflows, workers and pools, the executor and the Conductor module."""

from conductor.modules._answer import extract_answer
from conductor.modules._conductor import Conductor
from conductor.modules._executor import Budget, Executor, RunError, RunResult, StepTrace
from conductor.modules._failover import WorkerHealth
from conductor.modules._pool import WorkerPool
from conductor.modules._prompts import WorkerPromptAdapter, WorkflowAdapter
from conductor.modules._tracing import disable_tracing, enable_tracing, render_trace_html
from conductor.modules._worker import Completion, LMWorker, Messages, Price, Worker
from conductor.modules._workflow import Limits, Step, Workflow

__all__ = [
    "Budget",
    "Completion",
    "Conductor",
    "Executor",
    "LMWorker",
    "Limits",
    "Messages",
    "Price",
    "RunError",
    "RunResult",
    "Step",
    "StepTrace",
    "Worker",
    "WorkerHealth",
    "WorkerPool",
    "WorkerPromptAdapter",
    "Workflow",
    "WorkflowAdapter",
    "disable_tracing",
    "enable_tracing",
    "extract_answer",
    "render_trace_html",
]
