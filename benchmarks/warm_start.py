"""Does a supervised warm start teach SmolLM2-135M the workflow format?

Samples completions at temperature 1.0 for held-out questions from the real SmolLM2-135M-Instruct policy (LoRA r=16)
and counts how many parse and how many are valid for a 4-worker pool; then warm-starts it on synthetic workflows for
synthetic arithmetic and knowledge questions, and counts again. Prompts are the Conductor's own
(``Conductor.prompt_messages``). Training dominates the run time; on a CPU with AVX512-BF16, ``--dtype bfloat16``
about halves it.

    .venv/bin/python benchmarks/warm_start.py [--train 200] [--samples 64] [--threads 1] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from conductor.conductor_lm import ConductorLM, LoraSpec
from conductor.errors import WorkflowError
from conductor.modules import Conductor, WorkerPool, Workflow
from conductor.optimizers import WarmStartConfig, synthetic_workflows, warm_start
from conductor.testing import ScriptedWorker

CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Egypt", "Cairo"),
    ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Chile", "Santiago"),
    ("Greece", "Athens"), ("Poland", "Warsaw"), ("Ireland", "Dublin"), ("Cuba", "Havana"), ("Iran", "Tehran"),
    ("Portugal", "Lisbon"),
]  # fmt: skip
BOOKS = ["Hamlet", "Pride and Prejudice", "War and Peace", "Moby-Dick", "Don Quixote", "The Odyssey", "Faust", "Emma"]
ELEMENTS = ["gold", "iron", "sodium", "oxygen", "silver", "helium", "carbon", "copper", "lead", "tin"]
ITEMS = ["pens", "apples", "tickets", "books", "cups", "stamps"]


def make_questions(rng: random.Random, n: int, knowledge: tuple[list, list, list]) -> list[str]:
    """``n`` distinct simple questions: arithmetic, word problems, and facts about the given entities."""
    capitals, books, elements = knowledge
    kinds = [
        lambda: f"What is {rng.randint(2, 999)} {rng.choice('+-*')} {rng.randint(2, 99)}?",
        lambda: f"Compute {rng.randint(2, 50)} * {rng.randint(2, 50)} - {rng.randint(1, 100)}.",
        lambda: f"What is {rng.choice([5, 10, 15, 20, 25, 50])}% of {rng.randint(2, 80) * 10}?",
        lambda: (
            f"A shop sells {rng.choice(ITEMS)} at ${rng.randint(2, 9)} each. "
            f"How much do {rng.randint(3, 30)} of them cost?"
        ),
        lambda: f"What is the capital of {rng.choice(capitals)[0]}?",
        lambda: f"Which country has {rng.choice(capitals)[1]} as its capital?",
        lambda: f"Who wrote {rng.choice(books)}?",
        lambda: f"What is the chemical symbol for {rng.choice(elements)}?",
        lambda: f"Is {rng.randint(10, 500)} a prime number?",
    ]
    questions: dict[str, None] = {}
    while len(questions) < n:
        questions[rng.choice(kinds)()] = None
    return list(questions)


def measure(
    policy: ConductorLM, program: Conductor, questions: list[str], per_question: int, max_new_tokens: int
) -> dict[str, Any]:
    """Sample ``per_question`` completions at temperature 1.0 per question; the share that parse and that are valid,
    and why the others failed."""
    prompts = [program.prompt_messages(q) for q in questions]
    started = time.perf_counter()
    rows = policy.sample(prompts, per_question, temperature=1.0, max_new_tokens=max_new_tokens, seed=0, batch_size=32)
    seconds = time.perf_counter() - started
    samples = [s for row in rows for s in row]
    parsed, valid, lengths, failures, records = 0, 0, [], Counter(), []
    for sample in samples:
        text = sample.text.strip()
        try:
            workflow = Workflow.parse(text)
        except WorkflowError as exc:
            problems = exc.problems
        else:
            parsed += 1
            problems = program.workflow_problems(workflow)
        if problems:
            cut = " (cut at max tokens)" if sample.finish_reason == "length" else ""
            failures[re.sub(r"\d+", "N", problems[0])[:80] + cut] += 1
        else:
            valid += 1
            lengths.append(len(workflow))
        records.append(
            {"text": text, "finish": sample.finish_reason, "tokens": len(sample.token_ids), "problems": problems}
        )
    return {
        "parseable": 100 * parsed / len(samples),
        "valid": 100 * valid / len(samples),
        "steps": statistics.mean(lengths) if lengths else 0.0,
        "seconds": seconds,
        "failures": failures,
        "samples": records,
    }


def show(label: str, result: dict[str, Any]) -> None:
    print(
        f"{label}: {result['parseable']:.1f}% parseable, {result['valid']:.1f}% valid "
        f"(mean {result['steps']:.2f} steps), sampled in {result['seconds']:.0f} s"
    )
    for reason, count in result["failures"].most_common(5):
        print(f"  {count:3d} x {reason}")
    for kind, wanted in (("valid", True), ("failed", False)):
        text = next((r["text"] for r in result["samples"] if (not r["problems"]) == wanted), None)
        if text is not None:
            print(f"  a {kind} sample: {text[:400]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=200, help="synthetic training workflows")
    parser.add_argument("--held-out", type=int, default=16, help="held-out questions")
    parser.add_argument("--samples", type=int, default=64, help="samples before and after, over the held-out set")
    parser.add_argument("--max-steps", type=int, default=4, help="most steps of a synthetic workflow")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--dtype", default="float32", help="base weights' dtype (LoRA weights stay float32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-before", action="store_true", help="don't sample the untrained policy")
    parser.add_argument("--out", type=Path, help="folder for the samples (JSON) and the warm-started policy")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)

    rng = random.Random(args.seed)
    # held-out questions ask about entities the training questions never mention
    train_knowledge = (CAPITALS[:12], BOOKS[:6], ELEMENTS[:7])
    held_knowledge = (CAPITALS[12:], BOOKS[6:], ELEMENTS[7:])
    train_questions = make_questions(rng, args.train, train_knowledge)
    held_out = [q for q in make_questions(rng, 2 * args.held_out, held_knowledge) if q not in train_questions]
    held_out = held_out[: args.held_out]
    per_question = max(1, args.samples // len(held_out))

    program = Conductor(WorkerPool([ScriptedWorker(f"worker{i}") for i in range(4)]))
    examples = synthetic_workflows(len(program.pool), train_questions, max_steps=args.max_steps, seed=args.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)  # the LoRA initialisation
        policy = ConductorLM.from_pretrained(
            "smollm2-135m-instruct", lora=LoraSpec(r=16), dtype=args.dtype, device="cpu"
        )
    print(policy)
    print(f"{len(examples)} training workflows, {len(held_out)} held-out questions x {per_question} samples")
    print(f"a training completion:\n{examples[0][1].to_text()}")

    results = {}
    if not args.skip_before:
        results["before"] = measure(policy, program, held_out, per_question, args.max_new_tokens)
        show("before", results["before"])
    config = WarmStartConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    report = warm_start(policy, program, examples, config)
    print(
        f"warm start: {report.steps} steps over {report.examples} examples in {report.seconds:.0f} s "
        f"({report.seconds / report.steps:.1f} s/step, {report.completion_tokens} completion tokens); "
        f"loss {report.losses[0]:.3f} -> {statistics.mean(report.losses[-5:]):.3f} (mean of the last 5)"
    )
    results["after"] = measure(policy, program, held_out, per_question, args.max_new_tokens)
    show("after", results["after"])
    print("| | parseable | valid |\n|---|---|---|")
    for label, result in results.items():
        print(f"| {label} | {result['parseable']:.1f}% | {result['valid']:.1f}% |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        samples = {label: result["samples"] for label, result in results.items()}
        (args.out / "samples.json").write_text(json.dumps(samples, indent=1, ensure_ascii=False))
        policy.save(args.out / "policy")
        print(f"samples and policy written to {args.out}")


if __name__ == "__main__":
    main()
