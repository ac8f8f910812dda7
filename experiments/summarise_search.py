"""Issue 25's summary of the search ablation: ``results/search/summary.json``, ``ablation.md`` and ``shapes.md``.

The ablation of issue 11 (``summarise_orchestration.py``, whose choices this keeps) with one more system: the
conductor trained on program search's winners (``search_train.yaml``, no hand-written workflow) beside the one
trained on hand-written templates (``orchestration_fallback_train.yaml``). Both trained on the same questions, so the
test questions left out as seen in training are the same for every system. The search-trained rows, its unseen
pools and max_depth 1, and its unseen families are the records of ``search_ablation.yaml``, ``search_variants.yaml``
and ``search_unseen_families.yaml``; each model as a plain chat (the question alone) is ``search_plain_chat.yaml``;
``"search"`` is what the search cost (``results/search/trained/search/search.json``). Run 6's conductor after GRPO
(issue 26's pilot, on an earlier search warm start) is ``search_grpo_ablation.yaml``. ``front.png`` draws every system's
accuracy against its tokens per question, a conductor's own included (the pool is local: every system cost $0).

    python experiments/summarise_search.py
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from summarise_orchestration import (
    BASELINES,
    CONFIGS,
    DIRECT,
    SINGLES,
    TRAINED,
    TRAINING_RUNS,
    UNSEEN_POOLS,
    ablation_table,
    best_of,
    best_pipelines_on_validation,
    excluding,
    of,
    records,
    score,
    scored,
)

from conductor.bench import ALL, aggregate, plot_accuracy_cost
from conductor.bench.datasets import example_id
from conductor.cli import load_run_config

RESULTS = Path(__file__).resolve().parent / "results" / "search"
TEMPLATES = "template-trained conductor"
GRPO = "run 6 (earlier search warm start), then GRPO"


def renamed(units: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [{**r, "method": name} for r in units]


def ran(config_name: str, seen: set[str]) -> list[dict[str, Any]]:
    """The records of a bench config outside ``seen``, or none if it has not run yet (each row says its ``n``)."""
    try:
        return excluding(seen, records(config_name))
    except FileNotFoundError:
        return []


def paired(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, int]:
    """On the questions both answered: how many each got right where the other did not (McNemar's counts)."""
    right = {r["example_id"]: r["correct"] > 0 for r in theirs}
    both = [(r["correct"] > 0, right[r["example_id"]]) for r in ours if r["example_id"] in right]
    return {
        "questions": len(both),
        "only_search_right": sum(a and not b for a, b in both),
        "only_templates_right": sum(b and not a for a, b in both),
        "both_right": sum(a and b for a, b in both),
    }


def shape(workflow: dict[str, Any] | None) -> str:
    """A workflow as its workers in order (``gemma -> check``); ``(none)`` where the conductor wrote none."""
    return " -> ".join(workflow["workers"]) if workflow else "(none)"


def main() -> None:
    seen: set[str] = set()
    for config in (*TRAINING_RUNS, "search_train.yaml"):
        splits = load_run_config(CONFIGS / config).splits()
        seen |= {example_id(e) for e in [*splits.train, *splits.val]}
    ablation = records("orchestration_ablation.yaml")
    searched = [*excluding(seen, records("search_ablation.yaml")), *ran("search_variants.yaml", seen)]
    templated = excluding(seen, records("orchestration_fallback_ablation.yaml"), [TRAINED])
    plain = ran("search_plain_chat.yaml", seen)  # each model called with the question alone (issue 26)
    grpo = renamed(ran("search_grpo_ablation.yaml", seen), GRPO)
    test = [*excluding(seen, ablation, BASELINES), *searched, *renamed(templated, TEMPLATES), *plain, *grpo]
    answered = {r["example_id"] for r in of(test, TRAINED)}  # every system on the same questions: paired
    test = [r for r in test if r["example_id"] in answered]
    unseen = [*excluding(seen, records("orchestration_unseen_families.yaml"), SINGLES)]
    unseen += ran("search_unseen_families.yaml", seen)
    families = sorted({r["dataset"] for r in searched})
    pipelines = best_pipelines_on_validation(families)
    best_single = best_of(test, SINGLES)
    chats = sorted({r["method"] for r in plain})
    best_plain = best_of(test, chats) if chats else None
    systems = {
        "search-trained conductor": of(test, TRAINED),
        GRPO: of(test, GRPO),
        TEMPLATES: of(test, TEMPLATES),
        "best single worker": of(test, best_single),
        **({"best worker as a plain chat": of(test, best_plain)} if best_plain else {}),
        "best fixed pipeline": [r for f in families for r in of(test, pipelines[f], f)],
        **{name: of(test, name) for name in DIRECT},
    }
    systems = {name: units for name, units in systems.items() if units}  # a variant not run yet has no row
    shapes = {f: Counter(shape(r["workflow"]) for r in of(test, TRAINED, f)) for f in families}
    best_unseen = best_of(unseen, SINGLES)
    search = json.loads((RESULTS / "trained" / "search" / "search.json").read_text())
    summary = {
        **scored(systems, families),
        "chosen": {
            "best single worker": best_single,
            "best worker as a plain chat": best_plain,
            "best fixed pipeline": pipelines,
        },
        "multi_step_share": multi_step_shares(shapes),
        "paired_with_templates": paired(of(test, TRAINED), of(test, TEMPLATES)),
        "unseen_pools": {
            name.removeprefix("unseen pool: "): {
                "accuracy": score(of(test, name), name)["accuracy"],
                "n": len(of(test, name)),
            }
            for name in (TRAINED, *UNSEEN_POOLS)
            if of(test, name)
        },
        "unseen_families": {
            "trained conductor": score(of(unseen, TRAINED), TRAINED)["accuracy"],
            "best single worker": score(of(unseen, best_unseen), best_unseen)["accuracy"],
            "best single worker is": best_unseen,
            "n": len(of(unseen, TRAINED)),
        }
        if of(unseen, TRAINED)
        else "not run",
        "test_questions_left_out_as_seen_in_training": len({r["example_id"] for r in ablation} & seen),
        "search": {name: search[name] for name in ("candidates", "worker_calls", "tokens", "wall_s")},
    }
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = ablation_table(summary, families)
    (RESULTS / "ablation.md").write_text(table)
    (RESULTS / "shapes.md").write_text(shapes_table(shapes))
    fronts = [aggregate(name, ALL, units) for name, units in systems.items()]
    plot_accuracy_cost(fronts, RESULTS / "front.png", "Issue 11's test questions")
    print(table)
    for key in ("paired_with_templates", "multi_step_share", "unseen_pools", "unseen_families", "search"):
        print(f"{key}: {json.dumps(summary[key])}")


def multi_step_shares(shapes: dict[str, Counter]) -> dict[str, float]:
    """Per family, the share of test questions the conductor answered with a workflow of more than one step."""
    return {f: round(sum(n for s, n in c.items() if "->" in s) / c.total(), 4) for f, c in shapes.items()}


def shapes_table(shapes: dict[str, Counter]) -> str:
    """The workflows the search-trained conductor wrote on the test questions, per family, most written first."""
    lines = ["| family | workflow (workers in order) | questions |", "|---|---|--:|"]
    for family, counts in shapes.items():
        lines += [f"| {family} | {s} | {n} |" for s, n in counts.most_common()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
