"""OpenTelemetry spans for runs and steps, a JSON-lines span file, and a standalone HTML page of one run.

Tracing is off until ``enable_tracing`` is called. While off, the executor reads one module attribute per run and per
step and never imports OpenTelemetry. Spans nest under whatever span is current when ``Executor.run`` is called (a
DSPy/MLflow span, a web request), and step spans nest under the run span on worker threads too, because the executor
copies the caller's context into them. Token counts use the OTel GenAI attribute names (``gen_ai.usage.*``), the rest
``conductor.*``. Prompts and outputs are not put on spans (they may be private); the run's own trace has them.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

import dspy

from conductor.errors import MissingDependency
from conductor.modules._pool import WorkerPool

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

    from conductor.modules._executor import RunResult, StepTrace

logger = logging.getLogger(__name__)

tracer: Tracer | None = None
"""The tracer spans come from, or ``None`` while tracing is off (the executor's only check)."""

_owned: tuple[TracerProvider | None, SpanProcessor | None, IO[str] | None] = (None, None, None)
"""What ``enable_tracing`` created (a provider, the file's span processor, the open file), closed on disable."""


def enable_tracing(file: str | Path | None = None, *, provider: TracerProvider | None = None) -> TracerProvider:
    """Turn spans on and return the tracer provider they go to.

    ``file``: also append every span to this file as one JSON object per line (the SDK's console exporter writing to
    the file, batched off the hot path; ``disable_tracing`` flushes it). ``provider``: the tracer provider to use;
    by default a new SDK provider when ``file`` is given, else the global one (your app's OpenTelemetry set-up).
    """
    global tracer, _owned
    try:
        from opentelemetry import trace as otel_trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise MissingDependency(f"Tracing needs OpenTelemetry: pip install 'dspy-conductor[tracing]' ({exc})") from exc
    disable_tracing()
    made = TracerProvider() if provider is None and file is not None else None
    if provider is None:
        provider = made if made is not None else otel_trace.get_tracer_provider()
    processor = out = None
    if file is not None:
        out = Path(file).open("a", encoding="utf-8")  # noqa: SIM115 - open until disable_tracing
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        processor = BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
    _owned = (made, processor, out)
    tracer = provider.get_tracer("conductor")
    return provider


def disable_tracing() -> None:
    """Turn spans off; flush and close what ``enable_tracing`` opened."""
    global tracer, _owned
    tracer = None
    made, processor, out = _owned
    _owned = (None, None, None)
    if made is not None:
        made.shutdown()
    elif processor is not None:
        processor.shutdown()
    if out is not None:
        out.close()


# ---- spans (called only while tracing is on) ---------------------------------------------------------------------
def traced_run(tracer: Tracer, run: Callable[[], RunResult]) -> RunResult:
    """``run()`` inside a ``conductor.run`` span that ends with the run's totals."""
    with tracer.start_as_current_span("conductor.run") as span:
        result = run()
        span.set_attributes(
            {
                "conductor.steps": len(result.workflow) if result.workflow is not None else 0,
                "conductor.steps_run": len(result.steps),
                "gen_ai.usage.input_tokens": result.prompt_tokens,
                "gen_ai.usage.output_tokens": result.completion_tokens,
                "conductor.cost_usd": result.cost,
            }
        )
        if result.error is not None:
            _set_error(span, str(result.error))
    return result


def traced_step(tracer: Tracer, trace: StepTrace, run_step: Callable[[], None]) -> None:
    """``run_step()`` inside a ``conductor.step`` span that ends with what ``trace`` recorded."""
    with tracer.start_as_current_span("conductor.step") as span:
        run_step()
        span.set_attributes(
            {
                "conductor.step.index": trace.index,
                "conductor.worker": trace.worker,
                "conductor.answered_by": trace.answered_by or "",
                "conductor.role": trace.role,
                "gen_ai.usage.input_tokens": trace.prompt_tokens,
                "gen_ai.usage.output_tokens": trace.completion_tokens,
                "conductor.cost_usd": trace.cost,
                "conductor.latency_s": trace.latency_s,
                "conductor.attempts": trace.attempts,
            }
        )
        if trace.fallback_reason is not None:
            span.set_attribute("conductor.fallback_reason", trace.fallback_reason)
        if trace.error is not None:
            _set_error(span, trace.error)


def _set_error(span: Span, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("conductor.error", message)
    span.set_status(Status(StatusCode.ERROR, message))


# ---- an HTML page of one run -------------------------------------------------------------------------------------
_MERMAID = "https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.esm.min.mjs"
_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:90rem;color:#222}
table{border-collapse:collapse;font-size:.9rem}th,td{border:1px solid #ccc;padding:.3rem .5rem;vertical-align:top}
th{background:#f3f3f3;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.err{color:#b00020}pre{white-space:pre-wrap;margin:0}summary{cursor:pointer}"""


def render_trace_html(run: RunResult | dspy.Prediction, pool: WorkerPool) -> str:
    """A standalone HTML page for one run (a ``RunResult`` or a ``Conductor`` prediction): the workflow as a Mermaid
    chart with each step's cost, and a table of each step's worker, tokens, cost, latency and error. The chart is
    drawn by Mermaid from a CDN; offline, its source text shows instead."""
    if isinstance(run, dspy.Prediction):
        workflow, steps, error, answer = run.workflow, run.trace, run.error, run.response
    else:
        workflow, steps, error, answer = run.workflow, run.steps, run.error, run.answer
    esc = html.escape
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Conductor run</title>'
        f"<style>{_STYLE}</style></head><body>\n<h1>Conductor run</h1>",
        f"<p><b>Answer:</b> {esc(answer) if answer is not None else '<i>none</i>'}</p>",
        f"<p>{sum(s.prompt_tokens + s.completion_tokens for s in steps):,} tokens · "
        f"${sum(s.cost for s in steps):.6f} · {len(steps)} step(s) run</p>",
    ]
    if error is not None:
        parts.append(f'<p class="err"><b>Error:</b> {esc(str(error))}</p>')
    if workflow is not None:
        by_index = {s.index: s for s in steps}
        notes = [_note(by_index[i]) if i in by_index else "not run" for i in range(len(workflow))]
        parts.append(f'<h2>Workflow</h2>\n<pre class="mermaid">{esc(workflow.to_mermaid(pool.names, notes))}</pre>')
    parts += ["<h2>Steps</h2>", _table(steps)]
    parts.append(f'<script type="module">import mermaid from "{_MERMAID}"; mermaid.initialize({{startOnLoad: true}});')
    parts.append("</script>\n</body></html>\n")
    return "\n".join(parts)


def _note(step: StepTrace) -> str:
    note = f"${step.cost:.4g} · {step.prompt_tokens + step.completion_tokens} tok · {step.latency_s:.2f} s"
    if step.error is not None:
        return note + " · failed"
    if step.answered_by not in (None, step.worker):
        return note + f" · by {step.answered_by}"
    return note


def _table(steps: list[StepTrace]) -> str:
    esc = html.escape
    head = (
        "step",
        "worker",
        "answered by",
        "role",
        "subtask",
        "prompt tok",
        "output tok",
        "cost ($)",
        "latency (s)",
        "attempts",
        "fallback / error",
        "output",
    )
    rows = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for s in steps:
        problem = f'<span class="err">{esc(s.error)}</span>' if s.error is not None else esc(s.fallback_reason or "")
        cells = [
            f'<td class="n">{s.index}</td>',
            f"<td>{esc(s.worker)}</td>",
            f"<td>{esc(s.answered_by or '')}</td>",
            f"<td>{esc(s.role)}</td>",
            f"<td>{esc(s.subtask)}</td>",
            f'<td class="n">{s.prompt_tokens:,}</td>',
            f'<td class="n">{s.completion_tokens:,}</td>',
            f'<td class="n">{s.cost:.6f}</td>',
            f'<td class="n">{s.latency_s:.3f}</td>',
            f'<td class="n">{s.attempts}</td>',
            f"<td>{problem}</td>",
            f"<td><details><summary>show</summary><pre>{esc(s.output or '')}</pre></details></td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rows.append("</table>")
    return "\n".join(rows)
