"""Issue 25's broader studies, summarised: ``summary.json``, ``ablation.md``, ``shapes.md`` and ``front.png`` in the
study's results folder.

Two studies share this script: BIG-bench's (``--study bigbench``, configs ``search_broad_*.yaml``, results
``results/search/broad``: 6 families, whose archive has left PyPI) and BIG-Bench-Hard's (``--study bbh``, the default;
configs ``bbh_broad_*.yaml``, results ``results/bbh/broad``: 8 families). In each, the study's conductor (program
search, then its warm start; no hand-written workflow: ``<prefix>_train.yaml``'s, or for BBH ``_grpo.yaml``'s: a longer
warm start, then GRPO) on 50 test questions of each training family (``<prefix>_ablation.yaml``, where any further
conductor row is paired with every system too), beside the baselines on the same questions
(``<prefix>_baselines.yaml``); its variants on the first questions of each family (``<prefix>_variants.yaml``,
``<prefix>_plus_worker.yaml``, ``<prefix>_depth.yaml``: ``variants.md``), each compared with the trained conductor on
its training pool in the same run; on the 2 families it never saw, the single models (``<prefix>_unseen.yaml``,
``<prefix>_unseen_calculator.yaml``); and, as a candidate for the shipped default, the shipped router on that router's
own test split (``<prefix>_default.yaml``). A config not run yet leaves its rows out. Choices:

- "best single worker": the worker alone (SmolLM2, Gemma or the calculator) with the highest accuracy on these test
  questions overall (its best case); "best worker as a plain chat" likewise among the models called with the question
  alone;
- on the unseen families, two single workers: the best of them there (its best case, plain chats included), and
  the study's best single worker above, the one a user would have chosen on the training families;
- "best fixed pipeline": per family, the oracle table's best candidate (chosen by the search on the training
  questions, ``trained/search/oracle.json``), run as a fixed workflow: an oracle told the family;
- a pool without a worker has a ceiling: the best benched row that never calls that worker, per family, chosen in
  hindsight on the pool's questions (a share of the training pool's score above it can't be reached);
- the comparisons with the conductor are paired (the same questions), with Newcombe's 95% interval and McNemar's p.

    python experiments/summarise_broad.py [--study bbh|bigbench]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from summarise_orchestration import CONFIGS, ablation_table, best_of, excluding, of, records, score, scored
from summarise_search import multi_step_shares, ran, shape, shapes_table

from conductor.bench import ALL, aggregate, plot_accuracy_cost
from conductor.bench.datasets import example_id
from conductor.cli import load_run_config
from conductor.optimizers import paired_comparison

TRAINED = "trained conductor"
SINGLES = ("smollm2", "gemma", "calculator")  # every worker that answers alone (vote and check need candidates)
PLAIN_CHATS = ("smollm2 plain chat", "gemma plain chat")
ROUTER = "shipped router"
BROAD = "broad conductor"  # the trained conductor's name where it is a candidate for the shipped default
DIRECT = ("mixture-of-agents",)
TRAINING_POOL = "trained conductor, training pool"  # the variants' run's own trained-conductor row, paired with them
VARIANTS = ("untrained conductor", "trained conductor, max_depth 1")
UNSEEN_POOLS = ("unseen pool: reversed order", "unseen pool: without smollm2", "unseen pool: plus one worker")
REMOVED = {"unseen pool: without smollm2": "smollm2"}  # the worker a pool lacks


@dataclass(frozen=True)
class Study:
    prefix: str  # its configs are ``<prefix>_train.yaml``, ``<prefix>_ablation.yaml``, ...
    results: Path
    title: str  # the accuracy-cost plot's
    conductor: str = TRAINED  # the row, in the ablation and unseen configs, of the conductor the study reports
    row_of_candidate: dict[str, str] = field(default_factory=dict)  # oracle candidates run under another row's name

    def config(self, part: str) -> str:
        return f"{self.prefix}_{part}.yaml"

    def oracle_pipelines(self) -> dict[str, str]:
        """Per family, the row of the baselines config that runs the oracle table's best candidate."""
        oracle = json.loads((self.results / "trained" / "search" / "oracle.json").read_text())
        return {row["kind"]: self.row_of_candidate.get(row["best"], row["best"]) for row in oracle}


EXPERIMENTS = Path(__file__).resolve().parent
STUDIES = {
    "bbh": Study(
        "bbh_broad",
        EXPERIMENTS / "results" / "bbh" / "broad",
        "The BIG-Bench-Hard study's 8 families",
        conductor="trained conductor, 320 steps, then GRPO",  # the compile's program (FINDINGS.md says why)
    ),
    "bigbench": Study(
        "search_broad",
        EXPERIMENTS / "results" / "search" / "broad",
        "The broad study's 6 families",
        {"smollm2 [1]": "smollm2"},  # the baselines config runs this candidate as the single worker's row
    ),
}


def family_pipeline(pipelines: dict[str, str], family: str) -> str:
    """The oracle's row for a bench dataset label (a label may add the task's subtask to the oracle's kind)."""
    return next(row for kind, row in pipelines.items() if family == kind or family.startswith(kind + "/"))


def compared(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], name: str, us: str) -> dict[str, Any]:
    """``us`` (the units ``ours``) against ``theirs`` on the questions both answered: counts, difference, interval,
    p."""
    right = {r["example_id"]: r["correct"] for r in theirs}
    shared = [r for r in ours if r["example_id"] in right]
    comparison = paired_comparison(
        [right[r["example_id"]] for r in shared], [r["correct"] for r in shared], a=name, b=us
    )
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in comparison.as_dict().items()}


def ceiling_without(units: list[dict[str, Any]], questions: set[str], worker: str) -> float:
    """The accuracy on ``questions`` of the best benched row, per family and chosen in hindsight, among the rows that
    never call ``worker``: the most a pool without it reaches with the workflows measured here."""
    asked = [r for r in units if r["example_id"] in questions]
    calling = {(r["dataset"], r["method"]) for r in asked if worker in (r["workflow"] or {}).get("workers", ())}
    right: Counter[tuple[str, str]] = Counter()
    for r in asked:
        if (r["dataset"], r["method"]) not in calling:
            right[r["dataset"], r["method"]] += r["correct"]
    best: dict[str, float] = {}
    for (family, _), n in right.items():
        best[family] = max(best.get(family, 0.0), n)
    return round(sum(best.values()) / len(questions), 4)


def as_default(units: list[dict[str, Any]]) -> dict[str, Any] | str:
    """The broad conductor against the shipped router and the best single worker on the router's own test split
    (``<prefix>_default.yaml``), per family and paired, or "not run"."""
    if not of(units, BROAD):
        return "not run"
    best = best_of(units, SINGLES + PLAIN_CHATS[:1])
    rows = {BROAD: of(units, BROAD), ROUTER: of(units, ROUTER), best: of(units, best)}
    return {
        **scored(rows, sorted({r["dataset"] for r in units})),
        "best single worker is": best,
        "paired": {name: compared(rows[BROAD], rows[name], name, BROAD) for name in (ROUTER, best)},
    }


def summarise(study: Study) -> None:
    splits = load_run_config(CONFIGS / study.config("train")).splits()
    seen = {example_id(e) for e in [*splits.train, *splits.val]}
    conductor = study.conductor
    ablation = records(study.config("ablation"))
    further = sorted({r["method"] for r in ablation} - {conductor})  # other conductors benched beside it
    benched = [*ablation, *ran(study.config("baselines"), set())]
    variant_configs = (study.config("variants"), study.config("plus_worker"), study.config("depth"))
    variants = excluding(seen, [r for name in variant_configs for r in ran(name, set())])
    answered = {r["example_id"] for r in of(benched, conductor)}  # every system on the same questions: paired
    test = [r for r in excluding(seen, benched) if r["example_id"] in answered]
    unseen = excluding(seen, [*ran(study.config("unseen"), set()), *ran(study.config("unseen_calculator"), set())])
    families = sorted({r["dataset"] for r in of(test, conductor)})
    pipelines = study.oracle_pipelines()
    best_single, best_chat = best_of(test, SINGLES), best_of(test, PLAIN_CHATS)
    systems = {
        conductor: of(test, conductor),
        **{name: of(test, name) for name in further},
        "best single worker": of(test, best_single),
        "best worker as a plain chat": of(test, best_chat),
        "best fixed pipeline": [r for f in families for r in of(test, family_pipeline(pipelines, f), f)],
        ROUTER: of(test, ROUTER),
        **{name: of(test, name) for name in DIRECT},
    }
    systems = {name: units for name, units in systems.items() if units}  # a config not run yet has no row
    ours = systems[conductor]
    against = {name: compared(ours, units, name, conductor) for name, units in systems.items() if name != conductor}
    on_training_pool = of(variants, TRAINING_POOL)
    variant_rows = {
        name: of(variants, name) for name in (TRAINING_POOL, *VARIANTS, *UNSEEN_POOLS) if of(variants, name)
    }
    best_unseen = best_of(unseen, SINGLES + PLAIN_CHATS) if unseen else None
    unseen_singles = {  # the best there, and the study's best single worker, as a user would have chosen it
        best_unseen: of(unseen, best_unseen),
        f"{best_single} (the study's best single worker)": of(unseen, best_single),
    }
    shapes = {f: Counter(shape(r["workflow"]) for r in of(test, conductor, f)) for f in families}
    search = json.loads((study.results / "trained" / "search" / "search.json").read_text())
    summary = {
        **scored(systems, families),
        "chosen": {
            "conductor": conductor,
            "best single worker": best_single,
            "best worker as a plain chat": best_chat,
            "best fixed pipeline": pipelines,
        },
        "paired": against,
        "further_conductors_paired": {  # each against every other system, as the study's conductor is in "paired"
            name: {
                other: compared(systems[name], units, other, name) for other, units in systems.items() if other != name
            }
            for name in further
            if name in systems
        },
        "multi_step_share": multi_step_shares(shapes),
        "variants": {
            **scored(variant_rows, families),
            "paired": {
                name: compared(on_training_pool, units, name, TRAINING_POOL)
                for name, units in variant_rows.items()
                if name != TRAINING_POOL
            },
        }
        if on_training_pool
        else "not run",
        "unseen_pools": {
            name.removeprefix("unseen pool: "): {
                "accuracy": score(units, name)["accuracy"],
                "share_of_training_pool": round(
                    score(units, name)["accuracy"] / max(score(on_training_pool, TRAINING_POOL)["accuracy"], 1e-9), 4
                ),
                "n": len(units),
                **(
                    {"ceiling": ceiling_without(test, {r["example_id"] for r in units}, REMOVED[name])}
                    if name in REMOVED
                    else {}
                ),
            }
            for name, units in variant_rows.items()
            if name in UNSEEN_POOLS
        },
        "unseen_families": {
            **scored({conductor: of(unseen, conductor), **unseen_singles}, sorted({r["dataset"] for r in unseen})),
            "best single worker is": best_unseen,
            "paired": {
                name: compared(of(unseen, conductor), units, name, conductor) for name, units in unseen_singles.items()
            },
        }
        if of(unseen, conductor)
        else "not run",
        "as_shipped_default": as_default(ran(study.config("default"), set())),
        "test_questions_left_out_as_seen_in_training": len({r["example_id"] for r in benched} & seen),
        "search": {name: search[name] for name in ("candidates", "worker_calls", "tokens", "wall_s")},
    }
    (study.results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = ablation_table(summary, families, overall="all")
    (study.results / "ablation.md").write_text(table)
    (study.results / "shapes.md").write_text(shapes_table(shapes))
    if on_training_pool:
        (study.results / "variants.md").write_text(ablation_table(summary["variants"], families, overall="all"))
    fronts = [aggregate(name, ALL, units) for name, units in systems.items()]
    plot_accuracy_cost(fronts, study.results / "front.png", study.title)
    print(table)
    for key in (
        "paired",
        "further_conductors_paired",
        "multi_step_share",
        "variants",
        "unseen_pools",
        "unseen_families",
        "as_shipped_default",
    ):
        print(f"{key}: {json.dumps(summary[key])}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=sorted(STUDIES), default="bbh")
    summarise(STUDIES[parser.parse_args().study])
