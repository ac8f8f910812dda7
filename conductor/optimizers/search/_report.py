"""What a program search found, as files: the oracle table per kind of question, each question's winner, and the
cost.

Kinds are the examples' ``label`` field where the data has one; otherwise the search forms them: questions whose
best candidate is the same are one group (named for that candidate), and questions no candidate answers are one more.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from conductor.optimizers.search._search import STATE, SearchResult
from conductor.optimizers.search._space import Candidate

UNANSWERED = "no candidate answers"
UNSCORED = "not scored (the budget ran out)"


def groups(result: SearchResult, label: str | None = None) -> dict[str, list[int]]:
    """Question indices per kind: by ``label`` when every example has it, else by each question's winner (and the
    questions no candidate answered, and those the budget left unscored, as two more)."""
    by_label = label is not None and all(example.get(label) is not None for example in result.examples)
    out: dict[str, list[int]] = {}
    for i, example in enumerate(result.examples):
        if by_label:
            key = str(example.get(label))
        elif not result.outcomes[i]:
            key = UNSCORED
        else:
            winner = result.winner(i)
            key = winner.name if winner is not None else UNANSWERED
        out.setdefault(key, []).append(i)
    return dict(sorted(out.items()))


def oracle_rows(result: SearchResult, label: str | None = None) -> list[dict[str, Any]]:
    """Per kind: how many questions, the best candidate over all of them and its score, the best single worker's,
    and the candidates that win most of its questions."""
    rows = []
    for kind, members in groups(result, label).items():
        best, best_score = _best(result, members, result.candidates)
        single, single_score = _best(result, members, [c for c in result.candidates if len(c.steps) == 1])
        wins = Counter(w.name for w in (result.winner(i) for i in members) if w is not None)
        rows.append(
            {
                "kind": kind,
                "questions": len(members),
                "best": best.name if best else None,
                "best_score": best_score,
                "best_single": single.name if single else None,
                "best_single_score": single_score,
                "winners": dict(wins.most_common(3)),
            }
        )
    return rows


def _best(result: SearchResult, members: Sequence[int], pool: Sequence[Candidate]) -> tuple[Candidate | None, float]:
    """The candidate of ``pool`` with the best mean over ``members`` among those scored on all of them (the cheaper
    of equals); ``(None, 0.0)`` when none was."""
    scored = [c for c in pool if all(c.name in result.outcomes[i] for i in members)]
    if not scored or not members:
        return None, 0.0

    def mean(c: Candidate) -> float:
        return sum(result.outcomes[i][c.name].score for i in members) / len(members)

    best = min(scored, key=lambda c: (-mean(c), result.mean_price(c)))
    return best, mean(best)


def write_search_report(result: SearchResult, folder: str | Path, label: str | None = None) -> None:
    """``oracle.md`` and ``oracle.json`` (the table), ``questions.jsonl`` (each question's winner and scores),
    ``candidates.json`` (the space, by worker name) and ``search.json`` (what the search cost)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = oracle_rows(result, label)
    (folder / "oracle.json").write_text(json.dumps(rows, indent=2))
    (folder / "oracle.md").write_text(_table(rows, result))
    with open(folder / "questions.jsonl", "w") as f:
        for i, (example, row) in enumerate(zip(result.examples, result.outcomes, strict=True)):
            winner = result.winner(i)
            scores = {name: outcome.score for name, outcome in row.items()}
            record = {"index": i, "inputs": dict(example.inputs()), "winner": winner.name if winner else None}
            f.write(json.dumps({**record, "scores": scores}, default=str) + "\n")
    space = [{"name": c.name, "steps": [s.model_dump(mode="json") for s in c.steps]} for c in result.candidates]
    (folder / "candidates.json").write_text(json.dumps(space, indent=2))
    summary = {"candidates": len(result.candidates), **asdict(result.cost)}
    (folder / STATE).write_text(json.dumps({**summary, "rungs": result.rungs, "exhausted": result.exhausted}, indent=2))


def _table(rows: Sequence[dict[str, Any]], result: SearchResult) -> str:
    cost = result.cost
    lines = [
        f"Program search: {len(result.candidates)} candidates on {len(result.examples)} questions, "
        f"{cost.worker_calls} worker calls, {cost.tokens} tokens, {cost.wall_s:.0f} s"
        + (" (stopped by the worker-call budget)" if result.exhausted else ""),
        "",
        "| kind | questions | best candidate | score | best single worker | score | most frequent winners |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        winners = ", ".join(f"{name} ({n})" for name, n in r["winners"].items()) or "-"
        lines.append(
            f"| {r['kind']} | {r['questions']} | {r['best'] or '-'} | {r['best_score']:.2f} "
            f"| {r['best_single'] or '-'} | {r['best_single_score']:.2f} | {winners} |"
        )
    return "\n".join(lines) + "\n"
