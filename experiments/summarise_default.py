"""Issue 26, item 4, summarised: is the 10-family conductor (``default_train.yaml``'s warm start, or GRPO on top of it:
``default_grpo.yaml`` at lr 5e-4, ``default_grpo_gentle.yaml`` at 1e-4 and ``default_grpo_round_two.yaml``'s second
round of it; or ``default_rescored.yaml``'s search on the fixed scoring, its warm start and GRPO at 1e-4), or the
14-family one (``default_more_families.yaml``'s warm start and ``default_more_families_grpo.yaml``'s GRPO at 1e-4), a
better shipped default than the router in ``conductor/trained/local-routing``? Each one's rows in five BBH-study
benches, paired with the router's and the single workers' on the same questions, and each GRPO run's against the
program it began from (the issue's goal for RL: +3 points, or a fifth fewer worker calls within a point), written to
``results/default/summary.json`` and ``summary.md``:

- the router's own test split, as far as it still loads: GSM8K and MMLU (``bbh_broad_default.yaml``) and the BIG-bench
  arithmetic in words recovered from earlier runs (``bbh_broad_default_everyday.yaml``);
- the BBH study's 8 families, 50 test questions each (``bbh_broad_baselines.yaml``);
- the 5 BBH families no conductor trained on, against the best single worker there (``bbh_broad_unseen.yaml``'s 2,
  ``default_unseen.yaml``'s 3; a candidate counts on those it was benched on);
- the 24 questions a new user types first (``bbh_broad_default_everyday.yaml``);
- beside the rule, not judged by it: the four families the 14-family runs add, on their test parts
  (``default_new_families.yaml``), for a candidate benched there.

The issue's rule: it replaces the router only if it beats it on the router's split and on the families' test split,
and is at least as good as the best single worker on at least 2 families it never trained on.

    python experiments/summarise_default.py
"""

from __future__ import annotations

import json
from typing import Any

from summarise_broad import compared
from summarise_orchestration import CONFIGS, best_of, of, records, score

# each GRPO run's row, and the row of the program it began from: a warm start, or the round of GRPO before it
GRPO_RUNS = {
    "10-family conductor, GRPO": "10-family conductor",
    "10-family conductor, GRPO at lr 1e-4": "10-family conductor",
    "10-family conductor, rescored search, GRPO at lr 1e-4": "10-family conductor, rescored search",
    "10-family conductor, GRPO at lr 1e-4, two rounds": "10-family conductor, GRPO at lr 1e-4",
    "14-family conductor, GRPO at lr 1e-4": "14-family conductor",
}
CANDIDATES = tuple(dict.fromkeys([*GRPO_RUNS.values(), *GRPO_RUNS]))
ROUTER = "shipped router"
SINGLES = ("smollm2", "gemma", "calculator", "smollm2 plain chat", "gemma plain chat")
NEW_FAMILIES = "4 families the 14-family runs add"
RESULTS = CONFIGS.parent / "results" / "default"


def split(units: list[dict[str, Any]], candidate: str, against: list[str]) -> dict[str, Any]:
    """``candidate``'s score on ``units`` beside each of ``against``, paired with it."""
    rows = {name: score(of(units, name), name) for name in (candidate, *against) if of(units, name)}
    paired = {name: compared(of(units, candidate), of(units, name), name, candidate) for name in against}
    return {"scores": rows, "paired": paired}


def best_single(units: list[dict[str, Any]]) -> str:
    """The single worker (alone or as a plain chat) benched on ``units`` with the highest accuracy there."""
    return best_of(units, [name for name in SINGLES if of(units, name)])


def unseen_split(units: list[dict[str, Any]], candidate: str, trained_best: str) -> dict[str, Any]:
    """``candidate`` on an unseen family beside its best single worker there (what the rule compares with, named in
    ``"best_single"``), the single worker best on the trained families (the rule's other reading) and, where benched
    there, the router."""
    best = best_single(units)
    against = [name for name in dict.fromkeys([best, trained_best, ROUTER]) if of(units, name)]
    return {**split(units, candidate, against), "best_single": best}


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
            part["paired"][part["best_single"]]["difference"] >= 0 for part in unseen
        )
        >= 2,
    }


def of_candidate(candidate: str, parts: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``candidate`` on every split of ``parts``, against what the rule compares it with there."""
    unseen = {
        name.removeprefix("unseen: "): units
        for name, units in parts.items()
        if name.startswith("unseen: ") and of(units, candidate)
    }
    pooled = [unit for units in unseen.values() for unit in units]
    trained_best = best_single(parts["8 BBH families"])
    summary: dict[str, Any] = {
        "router_split": split(parts["gsm8k + mmlu"] + parts["arithmetic"], candidate, [ROUTER]),
        "router_split_by_dataset": {
            name: split(parts[name], candidate, [ROUTER]) for name in ("gsm8k + mmlu", "arithmetic")
        },
        "families": split(parts["8 BBH families"], candidate, [ROUTER, trained_best]),
        "unseen_families": {family: unseen_split(units, candidate, trained_best) for family, units in unseen.items()},
        # every unseen question it was benched on, against the router and every single worker
        "unseen_pooled": split(pooled, candidate, [name for name in (ROUTER, *SINGLES) if of(pooled, name)]),
        "own_questions": split(parts["own questions"], candidate, [ROUTER]),
    }
    if of(parts[NEW_FAMILIES], candidate):  # beside the rule, not judged by it
        summary["new_families"] = split(parts[NEW_FAMILIES], candidate, [ROUTER, best_single(parts[NEW_FAMILIES])])
    summary["rule"] = rule(summary)
    return summary


def grpo_against_start(parts: dict[str, list[dict[str, Any]]], grpo_run: str) -> dict[str, Any]:
    """Per split, the program of ``grpo_run`` paired with the one it began from, and the worker calls each made a
    question: the goal is a gain of 3 points whose interval excludes 0, or a fifth fewer calls with accuracy within a
    point."""
    start = GRPO_RUNS[grpo_run]
    rows = {}
    for name, units in parts.items():
        if not (of(units, start) and of(units, grpo_run)):
            continue  # an unseen family one of them was not benched on
        before, grpo = score(of(units, start), start), score(of(units, grpo_run), grpo_run)
        paired = compared(of(units, grpo_run), of(units, start), start, grpo_run)
        rows[name] = {"start": before, "grpo": grpo, "paired": paired}
    return rows


def table(summary: dict[str, Any], candidate: str) -> list[str]:
    lines = [
        f"| split | system | accuracy % [95% CI] (n) | the {candidate}'s lead, points (95%) |",
        "|---|---|---|---|",
    ]
    sections = [
        ("router's split (GSM8K, MMLU, arithmetic)", summary["router_split"]),
        *summary["router_split_by_dataset"].items(),
        ("8 BBH families", summary["families"]),
        *((f"unseen: {family}", part) for family, part in summary["unseen_families"].items()),
        ("unseen, pooled", summary["unseen_pooled"]),
        ("own questions", summary["own_questions"]),
        *([(f"{NEW_FAMILIES} (not judged)", summary["new_families"])] if "new_families" in summary else []),
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
    return [*lines, "", f"The issue's rule ({'met' if all(summary['rule'].values()) else 'not met'}):", *verdicts]


def grpo_table(rows: dict[str, Any]) -> list[str]:
    lines = [
        "| split | before GRPO % (calls a question) | after % (calls a question) | GRPO's lead, points (95%) | p |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        before, grpo, p = row["start"], row["grpo"], row["paired"]
        lines.append(
            f"| {name} | {100 * before['accuracy']:.1f} ({before['calls_per_question']:.2f}) | "
            f"{100 * grpo['accuracy']:.1f} ({grpo['calls_per_question']:.2f}) | "
            f"{100 * p['difference']:+.1f} ({100 * p['low']:+.1f} to {100 * p['high']:+.1f}) | "
            f"{'<1e-4' if p['p_value'] < 1e-4 else format(p['p_value'], '.3g')} |"  # compared() keeps 4 decimals
        )
    return lines


def benched_parts() -> dict[str, list[dict[str, Any]]]:
    """The five benches' records, by the split the rule reads them in, and the new families' bench beside them."""
    default, everyday = records("bbh_broad_default.yaml"), records("bbh_broad_default_everyday.yaml")
    unseen = records("bbh_broad_unseen.yaml") + records("default_unseen.yaml")
    return {
        "gsm8k + mmlu": default,
        "arithmetic": [r for r in everyday if r["dataset"] == "bigbench arithmetic (recovered)"],
        "8 BBH families": records("bbh_broad_baselines.yaml"),
        **{f"unseen: {f}": [r for r in unseen if r["dataset"] == f] for f in sorted({r["dataset"] for r in unseen})},
        "own questions": [r for r in everyday if r["dataset"] == "own questions"],
        NEW_FAMILIES: records("default_new_families.yaml"),
    }


def main() -> None:
    parts = benched_parts()
    judged = {name: units for name, units in parts.items() if not name.startswith("unseen: ") and name != NEW_FAMILIES}
    benched = [c for c in CANDIDATES if all(of(units, c) for units in judged.values())]
    summary: dict[str, Any] = {candidate: of_candidate(candidate, parts) for candidate in benched}
    lines = []
    for candidate in benched:
        lines += [f"## {candidate}", "", *table(summary[candidate], candidate), ""]
    against = {run: grpo_against_start(parts, run) for run, start in GRPO_RUNS.items() if {run, start} <= {*benched}}
    summary["grpo_against_start"] = against
    for run, rows in against.items():
        lines += [f"## {run} against the program it began from ({GRPO_RUNS[run]}), paired", "", *grpo_table(rows), ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (RESULTS / "summary.md").write_text("\n".join(lines).rstrip() + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
