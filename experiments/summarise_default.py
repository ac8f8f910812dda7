"""Issue 26, item 4, summarised: is the 10-family conductor (``default_train.yaml``) a better shipped default than the
router in ``conductor/trained/local-routing``? Its rows in four BBH-study benches, paired with the router's and the
single workers' on the same questions, written to ``results/default/summary.json`` and ``summary.md``:

- the router's own test split, as far as it still loads: GSM8K and MMLU (``bbh_broad_default.yaml``) and the BIG-bench
  arithmetic in words recovered from earlier runs (``bbh_broad_default_everyday.yaml``);
- the BBH study's 8 families, 50 test questions each (``bbh_broad_baselines.yaml``);
- the 2 BBH families no conductor trained on, against the best single worker there (``bbh_broad_unseen.yaml``);
- the 24 questions a new user types first (``bbh_broad_default_everyday.yaml``).

The issue's rule: it replaces the router only if it beats it on the router's split and on the families' test split,
and is at least as good as the best single worker on at least 2 families it never trained on.

    python experiments/summarise_default.py
"""

from __future__ import annotations

import json
from typing import Any

from summarise_broad import compared
from summarise_orchestration import CONFIGS, best_of, of, records, score

CANDIDATE = "10-family conductor"
ROUTER = "shipped router"
SINGLES = ("smollm2", "gemma", "calculator", "smollm2 plain chat", "gemma plain chat")
RESULTS = CONFIGS.parent / "results" / "default"


def split(units: list[dict[str, Any]], against: list[str]) -> dict[str, Any]:
    """The candidate's score on ``units`` beside each of ``against``, paired with it."""
    rows = {name: score(of(units, name), name) for name in (CANDIDATE, *against) if of(units, name)}
    paired = {name: compared(of(units, CANDIDATE), of(units, name), name, CANDIDATE) for name in against}
    return {"scores": rows, "paired": paired}


def best_single(units: list[dict[str, Any]]) -> str:
    """The single worker (alone or as a plain chat) benched on ``units`` with the highest accuracy there."""
    return best_of(units, [name for name in SINGLES if of(units, name)])


def rule(summary: dict[str, Any]) -> dict[str, bool]:
    """The issue's rule, part by part: a higher accuracy than the router on its split and on the families' test
    (the point estimates; the paired intervals are beside them in the table), and at least the best single worker's
    on at least 2 unseen families."""

    def lead(part: dict[str, Any], against: str) -> float:
        return part["paired"][against]["difference"]

    unseen = summary["unseen_families"].values()
    return {
        "beats the router on its split": lead(summary["router_split"], ROUTER) > 0,
        "beats the router on the families' test": lead(summary["families"], ROUTER) > 0,
        "at least the best single worker on 2 unseen families": sum(
            all(p["difference"] >= 0 for p in part["paired"].values()) for part in unseen
        )
        >= 2,
    }


def main() -> None:
    default, everyday = records("bbh_broad_default.yaml"), records("bbh_broad_default_everyday.yaml")
    arithmetic = [r for r in everyday if r["dataset"] == "bigbench arithmetic (recovered)"]
    own = [r for r in everyday if r["dataset"] == "own questions"]
    families, unseen = records("bbh_broad_baselines.yaml"), records("bbh_broad_unseen.yaml")
    unseen_by_family = {f: [r for r in unseen if r["dataset"] == f] for f in sorted({r["dataset"] for r in unseen})}
    summary: dict[str, Any] = {
        "router_split": split(default + arithmetic, [ROUTER]),
        "router_split_by_dataset": {
            name: split(units, [ROUTER]) for name, units in (("gsm8k + mmlu", default), ("arithmetic", arithmetic))
        },
        "families": split(families, [ROUTER, best_single(families)]),
        "unseen_families": {family: split(units, [best_single(units)]) for family, units in unseen_by_family.items()},
        "own_questions": split(own, [ROUTER]),
    }
    summary["rule"] = rule(summary)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = ["| split | system | accuracy % [95% CI] (n) | the 10-family conductor's lead, points (95%) |"]
    lines.append("|---|---|---|---|")
    sections = [
        ("router's split (GSM8K, MMLU, arithmetic)", summary["router_split"]),
        *summary["router_split_by_dataset"].items(),
        ("8 BBH families", summary["families"]),
        *((f"unseen: {family}", part) for family, part in summary["unseen_families"].items()),
        ("own questions", summary["own_questions"]),
    ]
    for name, part in sections:
        for system, s in part["scores"].items():
            low, high = (100 * x for x in s["ci95"])
            row = f"| {name} | {system} | {100 * s['accuracy']:.1f} [{low:.1f}, {high:.1f}] ({s['n']}) |"
            p = part["paired"].get(system)
            if p is not None:
                row += f" {100 * p['difference']:+.1f} ({100 * p['low']:+.1f} to {100 * p['high']:+.1f})"
            lines.append(row + " |")
    verdicts = [f"- {part}: {'yes' if held else 'no'}" for part, held in summary["rule"].items()]
    lines += ["", f"The issue's rule ({'met' if all(summary['rule'].values()) else 'not met'}):", *verdicts]
    (RESULTS / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
