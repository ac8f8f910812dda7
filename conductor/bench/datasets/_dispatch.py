"""One metric for a mix of benchmarks: each example is scored by the metric of its ``family``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dspy

from conductor.bench.datasets._arithmetic import arithmetic_metric
from conductor.bench.datasets._bigbench import bigbench_metric
from conductor.bench.datasets._gsm8k import gsm8k_metric
from conductor.bench.datasets._humaneval import humaneval_metric
from conductor.bench.datasets._mmlu import mmlu_metric
from conductor.errors import ConfigError

Metric = Callable[..., float]

_METRICS: dict[str, Metric] = {
    "arithmetic": arithmetic_metric,
    "mmlu": mmlu_metric,
    "gsm8k": gsm8k_metric,
    "gsm_symbolic": gsm8k_metric,
    "humaneval": humaneval_metric,
    "bigbench": bigbench_metric,
    "bbh": bigbench_metric,
}


def metric_for(family: str) -> Metric:
    """The metric of a task family ("mmlu", "gsm8k", "gsm_symbolic", "humaneval", "bigbench/<task>", "bbh/<task>",
    "arithmetic")."""
    try:
        return _METRICS[family.split("/")[0]]
    except KeyError:
        raise ConfigError(f"no metric for task family {family!r}; known: {sorted(_METRICS)}") from None


def metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """Score ``prediction`` with the metric of ``example.family``: 1.0 right, 0.0 wrong."""
    return metric_for(example.family)(example, prediction, trace)
