"""The report of a run: ``results.json`` (aggregates and the config that produced them), ``table.md`` and
``plot.png``. SIMULATED runs say so in every title."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conductor.bench._config import BenchConfig, SimulatedPool
from conductor.bench._plots import plot_accuracy_cost
from conductor.bench._results import ALL, Aggregate, Shapes, summarise, workflow_shapes

logger = logging.getLogger(__name__)

SIMULATED_NOTE = (
    "Every number here is SIMULATED: no model was called. Workers and tasks come from "
    "`conductor/bench/simulated.py`, whose accuracies, prices and lengths are ASSUMED (calibrated to the "
    "Conductor paper's averages)."
)
COLUMNS = ("n", "accuracy % [95% CI]", "$ / question", "tokens / question", "calls / question", "error rate")


def report_title(config: BenchConfig) -> str:
    return f"SIMULATED: {config.title}" if config.simulated else config.title


def _money(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.1e}" if value < 1e-3 else f"{value:.4f}"


def _cells(a: Aggregate) -> list[str]:
    accuracy = f"{100 * a.accuracy:.1f} [{100 * a.ci_low:.1f}, {100 * a.ci_high:.1f}]"
    return [str(a.n), accuracy, _money(a.cost), f"{a.tokens:,.0f}", f"{a.calls:.2f}", f"{a.error_rate:.1%}"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int, text_from: int = 0) -> list[str]:
    """A Markdown table whose columns from ``numeric_from`` on are right-aligned, up to ``text_from`` if given."""
    numeric = range(numeric_from, text_from or len(header))
    aligns = ["--:" if i in numeric else "---" for i in range(len(header))]
    return [f"| {' | '.join(row)} |" for row in (header, aligns, *rows)]


def _pool_text(config: BenchConfig) -> str:
    if isinstance(config.pool, SimulatedPool):
        models = config.pool.simulated.models
        return f"SIMULATED pool of {'the paper’s 7 models' if models is None else ', '.join(models)}"
    return "the embedded local pool" if config.pool == "default" else f"pool file `{_shown(Path(config.pool))}`"


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when below it, so committed reports hold no machine's paths."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else Path(relative).as_posix()


def markdown_report(
    config: BenchConfig,
    overall: Sequence[Aggregate],
    per_dataset: Sequence[Aggregate],
    shapes: Sequence[Shapes] = (),
) -> str:
    """The Markdown report: title, how to reproduce it, the overall table, accuracy by dataset, the full table, and
    the shapes of the workflows run (for methods that ran any)."""
    datasets = [d.label for d in config.datasets]
    lines = [f"# {report_title(config)}", ""]
    if config.simulated:
        lines += [f"**{SIMULATED_NOTE}**", ""]
    if config.source is not None:
        lines += [f"Reproduce: `conductor bench {_shown(config.source)}`", ""]
    described = ", ".join(d.describe() for d in config.datasets)
    seeds = ", ".join(map(str, config.seeds))
    lines += [f"{_pool_text(config)}; datasets: {described}; run seeds: {seeds}.", ""]
    lines += [
        "Accuracy pools every question of every dataset and seed; the 95% interval is Wilson's over those units "
        "(seeds repeat the same questions, so it is narrower than a fresh sample of questions would give). "
        "Tokens and cost are the whole run's (the workers' and a conductor's or router's own call); calls are "
        "worker steps; the error rate counts every unit with a recorded error (a conductor format error answered by "
        "its fallback included).",
        "",
        "## Overall",
        "",
    ]
    lines += _table(["method", *COLUMNS], [[a.method, *_cells(a)] for a in overall], 1)
    accuracy = {(a.method, a.dataset): a for a in [*per_dataset, *overall]}
    rows = [[a.method, *(f"{100 * accuracy[a.method, d].accuracy:.1f}" for d in [*datasets, ALL])] for a in overall]
    lines += ["", "## Accuracy by dataset (%)", ""]
    lines += _table(["method", *datasets, ALL], rows, 1)
    lines += ["", "## Per dataset", ""]
    lines += _table(["method", "dataset", *COLUMNS], [[a.method, a.dataset, *_cells(a)] for a in per_dataset], 2)
    if shapes:
        lines += ["", "## Workflow shapes", ""]
        lines += [
            "The workflow each unit ran (for a conductor, the one that gave the answer): each step as `worker[what it "
            "saw]` (`[]` nothing, `[all]` every earlier step, `[0]` step 0). Multi-step is the share of all units; "
            "the most common workflows are shares of those that ran one.",
            "",
        ]
        lines += shapes_table(shapes)
    return "\n".join(lines) + "\n"


def shapes_table(shapes: Sequence[Shapes], group: str = "dataset") -> list[str]:
    """The Markdown lines of a workflow-shape table: a row per ``Shapes``, its ``dataset`` in a column named
    ``group`` (``conductor train`` and ``compile`` group by kind of question)."""
    header = ["method", group, "n", "multi-step %", "steps", "rounds", "most common workflows"]
    return _table(header, [_shape_cells(s) for s in shapes], 2, text_from=len(header) - 1)


def _shape_cells(shapes: Shapes) -> list[str]:
    common = "; ".join(f"`{text}` {share:.0%}" for text, share in shapes.common)
    return [
        shapes.method,
        shapes.dataset,
        str(shapes.n),
        f"{100 * shapes.multi_step:.0f}",
        f"{shapes.steps:.2f}",
        f"{shapes.rounds:.2f}",
        common,
    ]


def results_json(
    config: BenchConfig, records: Sequence[dict[str, Any]], overall, per_dataset, shapes: Sequence[Shapes] = ()
) -> dict[str, Any]:
    """The results file: the aggregates and workflow shapes, and the config that produced them (its text, when read
    from a file)."""
    return {
        "title": report_title(config),
        "simulated": config.simulated,
        "config_path": _shown(config.source) if config.source else None,
        "config": config.source.read_text() if config.source else config.model_dump(mode="json"),
        "units": len(records),
        "overall": [dataclasses.asdict(a) for a in overall],
        "per_dataset": [dataclasses.asdict(a) for a in per_dataset],
        "workflow_shapes": [dataclasses.asdict(s) for s in shapes],
    }


def write_report(config: BenchConfig, records: Sequence[dict[str, Any]]) -> dict[str, Path]:
    """Write ``results.json``, ``table.md`` and ``plot.png`` into ``config.output``; returns their paths by kind."""
    methods, datasets = [m.name for m in config.methods], [d.label for d in config.datasets]
    overall, per_dataset = summarise(records, methods, datasets)
    shapes = workflow_shapes(records, methods, datasets)
    out = config.output
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "table": out / "table.md", "plot": out / "plot.png"}
    data = results_json(config, records, overall, per_dataset, shapes)
    paths["results"].write_text(json.dumps(data, indent=2) + "\n")
    paths["table"].write_text(markdown_report(config, overall, per_dataset, shapes))
    plot_accuracy_cost(overall, paths["plot"], report_title(config))
    logger.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return paths
