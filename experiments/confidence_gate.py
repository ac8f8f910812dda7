"""Issue 26, the rule's unseen part: would the best candidate default (``default_grpo_gentle.yaml``'s program) hold up
on families it never trained on if it fell back to its first worker whenever it is unsure which workers to use?

Declared before any result was read (December 6): the conductor's confidence in a question is the probability of the
``model_id`` line it writes greedily (the product of that line's token probabilities); the threshold is the 5th
percentile of that confidence on the compile's 77 validation questions (families it knows, held out from training);
below it the program's own fallback answers (``fallback: first_worker``: SmolLM2 through the library's prompt, the
workflow the ``smollm2`` single row runs). Every answer comes from the bench records (the candidate's row where it is
sure, the ``smollm2`` row where not), so only the conductor runs here; the gated rows go through
``summarise_default.py``'s rule.

    python experiments/confidence_gate.py probe 0 2 & python experiments/confidence_gate.py probe 1 2; wait
    python experiments/confidence_gate.py summarise

The probe (two processes of one torch thread, about 25 minutes on two cores) writes
``results/default/confidence_gate/confidences.<shard>.jsonl``; the summary writes ``summary.md`` and ``summary.json``
there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any

import torch
import yaml
from summarise_default import RESULTS, benched_parts, of_candidate, split, table
from summarise_orchestration import CONFIGS, of

import conductor
from conductor.bench import DatasetSpec
from conductor.bench.datasets import example_id
from conductor.cli import load_run_config

CANDIDATE = "10-family conductor, GRPO at lr 1e-4"
PROGRAM = RESULTS / "grpo_gentle" / "best"
FALLBACK = "smollm2"  # the single row that runs the program's fallback workflow
GATED = "gated on confidence"
CONFIGS_PROBED = (
    "bbh_broad_default.yaml",
    "bbh_broad_default_everyday.yaml",
    "bbh_broad_baselines.yaml",
    "bbh_broad_unseen.yaml",
    "default_unseen.yaml",
)
QUANTILE = 0.05
OUT = RESULTS / "confidence_gate"


def questions() -> list[tuple[str, Any]]:
    """(dataset label, example) for the compile's validation questions ("val") and every benched question."""
    found = [("val", example) for example in load_run_config(CONFIGS / "default_train.yaml").splits().val]
    for config in CONFIGS_PROBED:
        for spec in yaml.safe_load((CONFIGS / config).read_text())["datasets"]:
            dataset = DatasetSpec.model_validate(spec, context={"base_dir": CONFIGS})
            found += [(dataset.label, example) for example in dataset.load()]
    return found


def first_line_confidence(sample: Any, tokenizer: Any) -> float:
    """The probability of a completion's first line (``model_id = [...]``: which workers, in which order)."""
    logprob = 0.0
    for token, value in zip(sample.token_ids, sample.logprobs, strict=True):
        logprob += value
        if "\n" in tokenizer.decode([token]):
            break
    return math.exp(logprob)


def probe(shard: int, shards: int) -> None:
    """Every ``shards``-th question from ``shard``: the workers the conductor picks and its confidence in them."""
    torch.set_num_threads(1)
    program = conductor.load(PROGRAM)
    engine = program.orchestrate.lm.engine
    samples: list[Any] = []
    engine.on_sample = samples.append
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"confidences.{shard}.jsonl"
    done = {(r["dataset"], r["example_id"]) for r in map(json.loads, path.open())} if path.exists() else set()
    with path.open("a") as out:
        for i, (label, example) in enumerate(questions()):
            key = (label, example_id(example))
            if i % shards != shard or key in done:
                continue
            workflow = program.ask(example.question).workflow
            confidence = first_line_confidence(samples[-1], engine.model.tokenizer)
            workers = [step.worker for step in workflow.steps] if workflow else None
            out.write(
                json.dumps({"dataset": key[0], "example_id": key[1], "confidence": confidence, "workers": workers})
            )
            out.write("\n")
            out.flush()


def gated_parts(confidence: dict[tuple[str, str], float], threshold: float) -> dict[str, list[dict[str, Any]]]:
    """The benches' records with a gated row beside the candidate's: its record where its confidence reaches
    ``threshold``, the fallback row's where it doesn't."""
    parts = benched_parts()
    for units in parts.values():
        fallback = {(r["dataset"], r["example_id"]): r for r in of(units, FALLBACK)}
        for record in of(units, CANDIDATE):
            key = (record["dataset"], record["example_id"])
            sure = confidence[key[0], key[1].split("#")[0]] >= threshold  # a repeated question's id ends "#2"
            units.append({**(record if sure else fallback[key]), "method": GATED, "fell_back": not sure})
    return parts


def splits_and_their_datasets(parts: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Each split, then each of its datasets where it has several; and the unseen families pooled."""
    found = {}
    for name, units in parts.items():
        found[name] = units
        datasets = sorted({r["dataset"] for r in units})
        if len(datasets) > 1:
            found |= {f"{name}: {d}": [r for r in units if r["dataset"] == d] for d in datasets}
    found["unseen, pooled"] = [r for name, units in parts.items() if name.startswith("unseen: ") for r in units]
    return found


def against_the_candidate(units: list[dict[str, Any]]) -> dict[str, Any]:
    """The gated row paired with the ungated candidate on ``units``, and how many questions fell back."""
    return {
        **split(units, GATED, [CANDIDATE])["paired"][CANDIDATE],
        "fell_back": sum(r["fell_back"] for r in of(units, GATED)),
    }


def summarise() -> None:
    rows = [json.loads(line) for path in sorted(OUT.glob("confidences.*.jsonl")) for line in path.open()]
    confidence = {(r["dataset"], r["example_id"]): r["confidence"] for r in rows}
    validation = sorted(c for (dataset, _), c in confidence.items() if dataset == "val")
    threshold = validation[int(QUANTILE * len(validation))]
    parts = gated_parts(confidence, threshold)
    summary = of_candidate(GATED, parts)
    summary["threshold"] = threshold
    summary["against_the_candidate"] = {
        name: against_the_candidate(subset) for name, subset in splits_and_their_datasets(parts).items()
    }
    lines = [
        f"Threshold {threshold:.3f}: the {QUANTILE:.0%} quantile of the conductor's confidence in its workers on the "
        f"{len(validation)} validation questions (median {statistics.median(validation):.3f}).",
        "",
        "| split | fell back | gated % | candidate % | gated's lead, points (95%) |",
        "|---|---|---|---|---|",
    ]
    for name, paired in summary["against_the_candidate"].items():
        lead = f"{100 * paired['difference']:+.1f} ({100 * paired['low']:+.1f} to {100 * paired['high']:+.1f})"
        gated, alone = 100 * paired["accuracy_b"], 100 * paired["accuracy_a"]
        lines.append(f"| {name} | {paired['fell_back']} of {paired['n']} | {gated:.1f} | {alone:.1f} | {lead} |")
    lines += ["", *table(summary, GATED)]
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    shard = commands.add_parser("probe", help="the conductor's confidence on every question (one shard of them)")
    shard.add_argument("shard", type=int)
    shard.add_argument("shards", type=int)
    commands.add_parser("summarise", help="the gated row under the issue's rule")
    args = parser.parse_args()
    if args.command == "probe":
        probe(args.shard, args.shards)
    else:
        summarise()


if __name__ == "__main__":
    main()
