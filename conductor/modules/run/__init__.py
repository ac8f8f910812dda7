"""Running a workflow: the run's value types (budget, usage, step traces, errors, result), the executor that runs a
workflow over a pool within a budget, and tracing (OpenTelemetry spans, an HTML page of a run)."""

from conductor.modules.run._executor import Executor
from conductor.modules.run._tracing import disable_tracing, enable_tracing, render_trace_html
from conductor.modules.run._types import Budget, RunError, RunResult, StepTrace, Usage

__all__ = [
    "Budget",
    "Executor",
    "RunError",
    "RunResult",
    "StepTrace",
    "Usage",
    "disable_tracing",
    "enable_tracing",
    "render_trace_html",
]
