"""Issue 11's summary of the orchestration runs: ``results/orchestration/summary.json`` and ``ablation.md``.

The trained conductor's rows (max_depth 0 and 1, the unseen pools, the unseen families) are the records of the
fallback-trained conductor's runs (``orchestration_fallback_ablation.yaml``,
``orchestration_fallback_unseen_families.yaml``); the baselines' rows are those of the ablation's runs
(``orchestration_ablation.yaml``, ``orchestration_unseen_families.yaml``), on the same pool file, questions and seed.
Test questions that a training or selection phase saw (the expert pilot's train and validation parts; the fallback
conductor's come from the bench's train part) are left out of every system alike. Choices, made the same way for
every run:

- "best single worker": the single model with the highest accuracy on these test questions (its best case);
- "best fixed pipeline": per family, the fixed pipeline of the ablation config with the highest validation accuracy
  in the oracle table (``results/orchestration/oracle``), an oracle that is told the family;
- the unseen families compare the trained conductor with the single model best on them.

    python experiments/summarise_orchestration.py
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from conductor.bench import ALL, RESULTS_FILE, ResultsFile, aggregate
from conductor.bench.datasets import example_id
from conductor.cli import load_run_config

CONFIGS = Path(__file__).resolve().parent / "configs"
RESULTS = Path(__file__).resolve().parent / "results" / "orchestration"
SINGLES = ("smollm2", "gemma")
PIPELINES = ("gemma -> check", "smollm2 -> check")
TRAINED = "trained conductor"
UNSEEN_POOLS = ("unseen pool: reversed order", "unseen pool: without smollm2", "unseen pool: plus python")
OTHER_BASELINES = ("trained router", "untrained conductor", "mixture-of-agents")
DIRECT = (*OTHER_BASELINES, "trained conductor, max_depth 1")
BASELINES = (*SINGLES, *PIPELINES, *OTHER_BASELINES)
TRAINING_RUNS = ("orchestration_expert_pilot.yaml", "orchestration_fallback_train.yaml")


def records(config_name: str) -> list[dict[str, Any]]:
    """The records of a bench config's run, the last of each unit. The config is not validated: the checkpoints it
    names are not kept in git, and its records are all this needs."""
    output = yaml.safe_load((CONFIGS / config_name).read_text())["output"]
    return ResultsFile(CONFIGS / output / RESULTS_FILE).latest()


def excluding(seen: set[str], units: Sequence[dict[str, Any]], methods: Sequence[str] | None = None) -> list:
    """``units`` on questions outside ``seen`` (and of ``methods`` only, if given)."""
    return [r for r in units if r["example_id"] not in seen and (methods is None or r["method"] in methods)]


def score(units: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    a = aggregate(name, ALL, units)
    return {
        "accuracy": round(a.accuracy, 4),
        "ci95": [round(a.ci_low, 4), round(a.ci_high, 4)],
        "n": a.n,
        "calls_per_question": round(a.calls, 3),
        "tokens_per_question": round(a.tokens, 1),
    }


def scored(systems: dict[str, list[dict[str, Any]]], families: Sequence[str]) -> dict[str, Any]:
    """Each system's score over all its questions (``test``) and per family (``per_family``)."""
    return {
        "test": {name: score(units, name) for name, units in systems.items()},
        "per_family": {
            f: {name: score([r for r in units if r["dataset"] == f], name) for name, units in systems.items()}
            for f in families
        },
    }


def of(units: Sequence[dict[str, Any]], method: str, dataset: str | None = None) -> list[dict[str, Any]]:
    return [r for r in units if r["method"] == method and dataset in (None, r["dataset"])]


def best_of(units: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """The one of ``names`` with the highest accuracy on ``units``."""
    return max(names, key=lambda name: score(of(units, name), name)["accuracy"])


def best_pipelines_on_validation(families: Sequence[str]) -> dict[str, str]:
    """Per family, the ablation's fixed pipeline with the highest validation accuracy in the oracle table."""
    oracle = json.loads((RESULTS / "oracle" / "results.json").read_text())["per_dataset"]
    validation = {(a["method"], a["dataset"]): a["accuracy"] for a in oracle}
    return {family: max(PIPELINES, key=lambda name: validation[name, family]) for family in families}


def main() -> None:
    seen: set[str] = set()
    for config in TRAINING_RUNS:
        splits = load_run_config(CONFIGS / config).splits()
        seen |= {example_id(e) for e in [*splits.train, *splits.val]}
    ablation = records("orchestration_ablation.yaml")
    test = [*excluding(seen, ablation, BASELINES), *excluding(seen, records("orchestration_fallback_ablation.yaml"))]
    unseen = [
        *excluding(seen, records("orchestration_unseen_families.yaml"), SINGLES),
        *excluding(seen, records("orchestration_fallback_unseen_families.yaml")),
    ]
    families = sorted({r["dataset"] for r in test})
    pipelines = best_pipelines_on_validation(families)
    best_single = best_of(test, SINGLES)
    systems = {
        "trained conductor": of(test, TRAINED),
        "best single worker": of(test, best_single),
        "best fixed pipeline": [r for f in families for r in of(test, pipelines[f], f)],
        **{name: of(test, name) for name in DIRECT},
    }
    shapes = {f: [r["workflow"] for r in of(test, TRAINED, f)] for f in families}
    best_unseen = best_of(unseen, SINGLES)
    summary = {
        **scored(systems, families),
        "chosen": {"best single worker": best_single, "best fixed pipeline": pipelines},
        "multi_step_share": {
            f: round(sum(bool(w) and len(w["workers"]) > 1 for w in ws) / len(ws), 4) for f, ws in shapes.items()
        },
        "unseen_pools": {
            "training pool": score(of(test, TRAINED), TRAINED)["accuracy"],
            **{name.removeprefix("unseen pool: "): score(of(test, name), name)["accuracy"] for name in UNSEEN_POOLS},
        },
        "unseen_families": {
            "trained conductor": score(of(unseen, TRAINED), TRAINED)["accuracy"],
            "best single worker": score(of(unseen, best_unseen), best_unseen)["accuracy"],
            "best single worker is": best_unseen,
            "n": len(of(unseen, TRAINED)),
        },
        "test_questions_left_out_as_seen_in_training": len({r["example_id"] for r in ablation} & seen),
    }
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = ablation_table(summary, families)
    (RESULTS / "ablation.md").write_text(table)
    print(table)
    for key in ("multi_step_share", "unseen_pools", "unseen_families"):
        print(f"{key}: {json.dumps(summary[key])}")


def ablation_table(summary: dict[str, Any], families: Sequence[str], overall: str = "both") -> str:
    """The Markdown ablation table: accuracy with its 95% Wilson interval per family and ``overall`` (over every
    family), worker calls and tokens (a conductor's own included) per question, one row per system."""

    def cell(s: dict[str, Any]) -> str:
        return f"{100 * s['accuracy']:.0f} [{100 * s['ci95'][0]:.0f}, {100 * s['ci95'][1]:.0f}]"

    header = ["system", *(f"{f} % (n)" for f in families), f"{overall} % [95% CI]", "calls / q", "tokens / q"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, total in summary["test"].items():
        per = [f"{cell(summary['per_family'][f][name])} ({summary['per_family'][f][name]['n']})" for f in families]
        row = [name, *per, cell(total), f"{total['calls_per_question']:.2f}", f"{total['tokens_per_question']:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
