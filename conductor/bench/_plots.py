"""The accuracy-against-cost plot of a run: one point per method, with its 95% interval (matplotlib, Agg, PNG)."""

from __future__ import annotations

import itertools
import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path

from conductor.bench._results import Aggregate
from conductor.errors import MissingDependency

logger = logging.getLogger(__name__)

_LOG_SPREAD = 20  # a log x axis once the costs span more than this factor
_MARKERS = "osD^vPX"  # 7 markers against the default 10 colours: no pair repeats before 70 methods


def x_axis(overall: Sequence[Aggregate]) -> tuple[str, str, list[float]]:
    """``(name, label, values)`` of the x axis: cost per question, or tokens per question (the workers' and a
    conductor's own) when every method cost nothing (a local pool has no prices)."""
    if any(a.cost > 0 for a in overall):
        return "cost per question", "cost per question ($)", [a.cost for a in overall]
    name = "tokens per question"
    return name, f"{name}, a conductor's own included (every method cost $0)", [a.tokens for a in overall]


def plot_accuracy_cost(overall: Sequence[Aggregate], path: Path, title: str) -> Path:
    """Draw each method's accuracy (with its Wilson 95% interval) against its cost per question into ``path``, titled
    ``title: accuracy vs <the x axis>``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependency("plots need matplotlib: pip install 'dspy-conductor[experiments]'") from exc
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    name, label, xs = x_axis(overall)
    figure, axes = plt.subplots(figsize=(10, 5.5), dpi=120)
    for aggregate, x, marker in zip(overall, xs, itertools.cycle(_MARKERS), strict=False):
        y = 100 * aggregate.accuracy
        errors = [[y - 100 * aggregate.ci_low], [100 * aggregate.ci_high - y]]
        axes.errorbar(x, y, yerr=errors, fmt=marker, capsize=3, label=aggregate.method)
    positive = [x for x in xs if x > 0]
    if len(positive) == len(xs) and max(positive) > _LOG_SPREAD * min(positive):
        axes.set_xscale("log")
    axes.set_xlabel(label)
    axes.set_ylabel("accuracy (%), 95% Wilson interval")
    axes.set_title("\n".join(textwrap.wrap(f"{title}: accuracy vs {name}", 90)), fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    logger.info("wrote %s", path)
    return path
