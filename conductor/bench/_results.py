"""Aggregates of unit records: accuracy with a Wilson 95% interval, and cost, tokens, calls, latency and errors per
question, per method and dataset and over all datasets; and the shapes of the workflows each method ran."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor._stats import wilson_interval

ALL = "all"
"""The dataset label of the aggregates over every dataset (all questions pooled)."""


@dataclass(frozen=True)
class Aggregate:
    """One method on one dataset (or ``ALL``), over every seed: per-question means of the unit records."""

    method: str
    dataset: str
    n: int
    correct: float
    accuracy: float
    ci_low: float
    ci_high: float
    cost: float
    tokens: float
    calls: float
    latency_s: float
    error_rate: float
    errors: dict[str, int] = field(default_factory=dict)


def aggregate(method: str, dataset: str, records: Sequence[dict[str, Any]]) -> Aggregate:
    """The aggregate of ``records`` (the units of one method on one dataset, or on all)."""
    n = len(records)
    correct = math.fsum(r["correct"] for r in records)
    low, high = wilson_interval(correct, n)

    def mean(name: str) -> float:
        return math.fsum(r[name] for r in records) / n if n else 0.0

    errors = Counter(r["error_kind"] for r in records if r["error_kind"] is not None)
    return Aggregate(
        method=method,
        dataset=dataset,
        n=n,
        correct=correct,
        accuracy=correct / n if n else 0.0,
        ci_low=low,
        ci_high=high,
        cost=mean("cost"),
        tokens=mean("tokens"),
        calls=mean("calls"),
        latency_s=mean("latency_s"),
        error_rate=sum(errors.values()) / n if n else 0.0,
        errors=dict(sorted(errors.items())),
    )


def by_method_and_dataset(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The records of each ``(method, dataset)``, in the order given."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["method"], record["dataset"]), []).append(record)
    return groups


def summarise(
    records: Iterable[dict[str, Any]], methods: Sequence[str], datasets: Sequence[str]
) -> tuple[list[Aggregate], list[Aggregate]]:
    """``(overall, per_dataset)``: one aggregate per method over every dataset (every question of every dataset and
    seed pooled), and one per method and dataset; in the order of ``methods`` and ``datasets``."""
    groups = by_method_and_dataset(records)
    per_dataset = [aggregate(m, d, groups.get((m, d), [])) for m in methods for d in datasets]
    overall = [aggregate(m, ALL, [r for d in datasets for r in groups.get((m, d), [])]) for m in methods]
    return overall, per_dataset


@dataclass(frozen=True)
class Shapes:
    """The workflows one method ran on one dataset, from the records' ``workflow`` (``run.workflow_shape``)."""

    method: str
    dataset: str
    n: int
    ran: int
    """Units that ran a workflow."""
    multi_step: float
    """Share of the ``n`` units whose workflow had two steps or more."""
    steps: float
    """Mean steps of the workflows run."""
    rounds: float
    """Mean conductor rounds (1 without recursion)."""
    common: list[tuple[str, float]]
    """The most common workflows (``shape_text``) and their shares of those run, commonest first."""


def shape_text(workflow: dict[str, Any]) -> str:
    """A workflow in one line, each step's worker with what it saw: ``gemma[] -> check[all]``, ``a[] -> b[0]``."""
    seen = ["all" if access == "all" else ",".join(map(str, access)) for access in workflow["access"]]
    text = " -> ".join(f"{worker}[{s}]" for worker, s in zip(workflow["workers"], seen, strict=True))
    return text if workflow["rounds"] == 1 else f"{text} ({workflow['rounds']} rounds)"


def workflow_shapes(
    records: Iterable[dict[str, Any]], methods: Sequence[str], datasets: Sequence[str], top: int = 3
) -> list[Shapes]:
    """One ``Shapes`` per method and dataset (``top`` common workflows each), in the order of ``methods`` and
    ``datasets``; methods that never ran a workflow are left out."""
    groups = by_method_and_dataset(records)
    out = []
    for method in methods:
        if not any(r.get("workflow") for d in datasets for r in groups.get((method, d), [])):
            continue
        for dataset in datasets:
            units = groups.get((method, dataset), [])
            run = [r["workflow"] for r in units if r.get("workflow")]
            counts = Counter(shape_text(w) for w in run)
            out.append(
                Shapes(
                    method=method,
                    dataset=dataset,
                    n=len(units),
                    ran=len(run),
                    multi_step=sum(len(w["workers"]) > 1 for w in run) / len(units) if units else 0.0,
                    steps=math.fsum(len(w["workers"]) for w in run) / len(run) if run else 0.0,
                    rounds=math.fsum(w["rounds"] for w in run) / len(run) if run else 0.0,
                    common=[(text, count / len(run)) for text, count in counts.most_common(top)],
                )
            )
    return out
