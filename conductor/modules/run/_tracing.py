"""OpenTelemetry spans for runs and steps, a JSON-lines span file, and a standalone HTML page of one run.

Tracing is off until ``enable_tracing`` is called. While off, the executor reads one module attribute per run and per
step and never imports OpenTelemetry. Spans nest under whatever span is current when ``Executor.run`` (or ``arun``) is
called (a DSPy/MLflow span, a web request), and step spans nest under the run span, because each step's task starts
in a copy of the run's context. Token counts use the OTel GenAI attribute names (``gen_ai.usage.*``), the rest
``conductor.*``. Prompts and outputs are not put on spans (they may be private); the run's own trace has them.

The page's chart is SVG drawn here, not Mermaid or Graphviz: a few boxes need no layout engine; it must work offline.
"""

from __future__ import annotations

import html
import logging
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple

import dspy

from conductor.errors import MissingDependency
from conductor.modules.pool import WorkerPool
from conductor.modules.run._types import RunResult, StepTrace
from conductor.modules.workflow import Access, Workflow

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

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
async def traced_run(tracer: Tracer, run: Callable[[], Awaitable[RunResult]]) -> RunResult:
    """``await run()`` inside a ``conductor.run`` span that ends with the run's totals."""
    with tracer.start_as_current_span("conductor.run") as span:
        result = await run()
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


async def traced_step(tracer: Tracer, trace: StepTrace, run_step: Callable[[], Awaitable[None]]) -> None:
    """``await run_step()`` inside a ``conductor.step`` span that ends with what ``trace`` recorded."""
    with tracer.start_as_current_span("conductor.step") as span:
        await run_step()
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
_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:90rem;color:#222}
table{border-collapse:collapse;font-size:.9rem}th,td{border:1px solid #ccc;padding:.3rem .5rem;vertical-align:top}
th{background:#f3f3f3;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.err{color:#b00020}.legend{color:#555;font-size:.85rem;margin-top:0}pre{white-space:pre-wrap;margin:0}
summary{cursor:pointer}
svg.chart text{font:13px system-ui,sans-serif;fill:#222}svg.chart text.head{font-weight:600}
svg.chart text.note{fill:#555}svg.chart text.bad{fill:#b00020}svg.chart path{fill:none;stroke:#777;stroke-width:1.3}
svg.chart polygon{fill:#777}"""
# Nothing may load: no script runs and nothing is fetched, even if run text slipped past the escaping.
_POLICY = "default-src 'none'; style-src 'unsafe-inline'"
_BOX_WIDTH, _LINE, _PAD, _GAP, _MARGIN = 620, 17, 10, 22, 8
_LOOKS = {  # box fill, border, dashes
    "ok": ("#f2f7ff", "#4a78c2", ""),
    "fallback": ("#fff7e0", "#c98a00", ""),
    "failed": ("#fdecee", "#b00020", ""),
    "not-run": ("#f6f6f6", "#999", ' stroke-dasharray="5 4"'),
}


class _Box(NamedTuple):
    """One step as the chart draws it: what the workflow asked (or the trace recorded) and how it ended."""

    index: int
    worker: str
    role: str
    subtask: str
    sees: Access
    trace: StepTrace | None


def render_trace_html(run: RunResult | dspy.Prediction, pool: WorkerPool) -> str:
    """A standalone HTML page for one run (a ``RunResult`` or a ``Conductor`` prediction): the answer and totals,
    then for the workflow (for each round of a recursive run) a chart of its steps with each one's worker, role,
    subtask, tokens, cost, latency and error, and a table of the same with each step's output.

    The page works offline and fetches nothing: the chart is SVG drawn here, and a content security policy forbids
    scripts and network loads. Every text from the run is escaped.
    """
    if isinstance(run, dspy.Prediction):
        workflow, steps, error, answer = run.workflow, run.trace, run.error, run.response
        rounds = run.get("rounds") or []
    else:
        workflow, steps, error, answer, rounds = run.workflow, run.steps, run.error, run.answer, []
    esc = html.escape
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}"><title>Conductor run</title>'
        f"<style>{_STYLE}</style></head><body>\n<h1>Conductor run</h1>",
        f"<p><b>Answer:</b> {esc(answer) if answer is not None else '<i>none</i>'}</p>",
        f"<p>{sum(s.prompt_tokens + s.completion_tokens for s in steps):,} tokens · "
        f"${sum(s.cost for s in steps):.6f} · {len(steps)} step(s) run</p>",
    ]
    if error is not None:
        parts.append(f'<p class="err"><b>Error:</b> {esc(str(error))}</p>')
    if len(rounds) > 1:
        for number, done in enumerate(rounds, 1):
            # A recursive round that gave no answer carries the round before's workflow: draw only what it ran.
            own = done.workflow if number == 1 or done.workflow is not rounds[number - 2].workflow else None
            parts.append(f"<h2>Round {number} of {len(rounds)}</h2>")
            if done.error is not None:
                parts.append(f'<p class="err"><b>Error:</b> {esc(str(done.error))}</p>')
            parts.append(_section(_boxes(own, done.trace, pool.names), done.trace, "h3"))
    else:
        parts.append("<h2>Workflow</h2>\n" + _section(_boxes(workflow, steps, pool.names), steps, "h2"))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _boxes(workflow: Workflow | None, steps: list[StepTrace], names: list[str]) -> list[_Box]:
    """The workflow's steps, each with its trace if it ran; without a workflow, the steps the trace recorded."""
    if workflow is None:
        return [_Box(s.index, s.worker, s.role, s.subtask, s.visible, s) for s in steps]
    ran = {s.index: s for s in steps}
    boxes = []
    for i, step in enumerate(workflow.steps):
        if i in ran:  # the trace knows the role the step ran with, the default one included
            worker, role = ran[i].worker, ran[i].role
        else:
            worker = names[step.worker] if 0 <= step.worker < len(names) else f"Model {step.worker}"
            role = step.role or ""
        boxes.append(_Box(i, worker, role, step.subtask, step.access, ran.get(i)))
    return boxes


def _section(boxes: list[_Box], steps: list[StepTrace], heading: str) -> str:
    if not boxes:
        return "<p><i>No steps ran.</i></p>"
    legend = '<p class="legend">An arrow leads from each step to the later steps that see its output.</p>'
    return f"{_chart(boxes)}\n{legend}\n<{heading}>Steps</{heading}>\n{_table(steps)}"


def _chart(boxes: list[_Box]) -> str:
    """An SVG of ``boxes`` in a column, top to bottom, with an arrow on the right from every step a step sees."""
    texts = [_lines(box) for box in boxes]
    heights = [2 * _PAD + _LINE * len(lines) for lines in texts]
    tops = [_MARGIN + sum(heights[:i]) + _GAP * i for i in range(len(boxes))]
    row = {box.index: i for i, box in enumerate(boxes)}
    right = _MARGIN + _BOX_WIDTH
    arrows, widest = [], 0
    for i, box in enumerate(boxes):
        sources = range(box.index) if box.sees == "all" else box.sees
        for j in sorted(row[s] for s in sources if s in row and row[s] < i):
            bend = 18 + 14 * (i - j)
            widest = max(widest, bend)
            y0, y1 = round(tops[j] + heights[j] * 0.65), round(tops[i] + heights[i] * 0.35)
            arrows.append(
                f'<path d="M{right} {y0} C{right + bend} {y0} {right + bend} {y1} {right + 8} {y1}"/>'
                f'<polygon points="{right + 1},{y1} {right + 9},{y1 - 4} {right + 9},{y1 + 4}"/>'
            )
    width, height = right + widest + _MARGIN + 4, tops[-1] + heights[-1] + _MARGIN
    body = [_box_svg(*drawn) for drawn in zip(boxes, texts, tops, heights, strict=True)]
    return (
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="workflow chart">\n' + "\n".join(body + arrows) + "\n</svg>"
    )


def _look(trace: StepTrace | None) -> str:
    if trace is None:
        return "not-run"
    if trace.error is not None:
        return "failed"
    return "fallback" if trace.answered_by not in (None, trace.worker) else "ok"


def _lines(box: _Box) -> list[tuple[str, str]]:
    """The box's text lines, each with its CSS class: head, subtask (two lines at most), numbers, how it ended."""
    head = f"{box.index} · {box.worker}" + (f" · {box.role}" if box.role else "")
    sees = "all" if box.sees == "all" else ", ".join(map(str, box.sees)) or "none"
    subtask = textwrap.wrap(" ".join(box.subtask.split()), 84, max_lines=2, placeholder=" …")
    lines = [("head", _clip(head, 80)), *(("task", line) for line in subtask)]
    trace, look = box.trace, _look(box.trace)
    if trace is None:
        return [*lines, ("note", f"not run · sees {sees}")]
    tokens = trace.prompt_tokens + trace.completion_tokens
    lines.append(("note", f"{tokens:,} tok · ${trace.cost:.6f} · {trace.latency_s:.2f} s · sees {sees}"))
    if look == "failed":
        lines.append(("bad", _clip(f"✗ failed: {trace.error}", 90)))
    elif look == "fallback":
        lines.append(("note", _clip(f"↪ answered by {trace.answered_by}", 90)))
    return lines


def _box_svg(box: _Box, lines: list[tuple[str, str]], top: int, height: int) -> str:
    """One step's box: a rectangle, its text lines, and the full subtask and error as a tooltip."""
    look = _look(box.trace)
    fill, stroke, dashes = _LOOKS[look]
    esc = html.escape
    tip = box.subtask + (f"\n\n{box.trace.error}" if look == "failed" else "")
    texts = "".join(
        f'<text x="{_MARGIN + _PAD}" y="{top + _PAD + _LINE * (n + 1) - 4}" class="{cls}">{esc(text)}</text>'
        for n, (cls, text) in enumerate(lines)
    )
    return (
        f'<g class="step {look}" data-index="{box.index}"><title>{esc(tip)}</title>'
        f'<rect x="{_MARGIN}" y="{top}" width="{_BOX_WIDTH}" height="{height}" rx="6" fill="{fill}" '
        f'stroke="{stroke}"{dashes}/>{texts}</g>'
    )


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
