"""``conductor eval PROGRAM_DIR --config CONFIG``: score a saved program on one split of the config's data.

Prints accuracy (over n questions), dollars and tokens per question and the share of workflows that didn't parse;
``--answers FILE`` keeps each question's result. Also what ``train`` and ``compile`` end with (``held_out``): the
program before and after, scored on the validation and test splits, and the workflows each wrote per kind of question.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from rich.table import Table

from conductor.bench import ALL, shapes_table, workflow_shape, workflow_shapes
from conductor.cli._common import add_trust_argument, console, evaluation_progress, fail, status
from conductor.deploy import load_program
from conductor.errors import ConductorError
from conductor.modules import ReplayStore
from conductor.optimizers import evaluate_program

LABEL = "family"
"""The example field that says what kind of question it is (the loaders set it); without it, all are one kind."""


def register(commands) -> None:
    parser = commands.add_parser("eval", help="score a saved program on a split of a config's data")
    parser.add_argument("program", metavar="PROGRAM_DIR", help="a saved program folder (e.g. OUTPUT_DIR/program)")
    parser.add_argument("--config", required=True, metavar="CONFIG", help="the run config naming data and metric")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test")
    parser.add_argument("--threads", type=int, default=1, help="questions run at once (in each Ray task with --ray)")
    add_ray_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument(
        "--answers",
        metavar="FILE",
        help="also write each question's result to FILE, one JSON object a line: the question, the program's "
        "answer, the expected answer, its score, the workflow the conductor wrote (workers by name), tokens, cost, "
        f"and the question's {LABEL} and the run's error where there is one",
    )
    add_trust_argument(parser)
    parser.set_defaults(handler=handle)


def add_ray_argument(parser: argparse.ArgumentParser) -> None:
    """``--ray ADDRESS``: score on a Ray cluster, overriding the config's ``ray``."""
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="score on a Ray cluster: 'auto' (the one `ray start` runs here), 'local', or ray://HOST:PORT "
        "(default: the config's `ray`, else in this process)",
    )


def handle(args: argparse.Namespace) -> int:
    from conductor.cli._config import load_run_config  # imports torch: only when the command runs

    try:
        if args.answers is not None and Path(args.answers).is_dir():
            raise ConductorError(f"--answers {args.answers} is a folder: name a file to write, e.g. answers.jsonl")
        config = load_run_config(args.config)
        with status.status("Loading the data and the program…"):
            examples = getattr(config.splits(), args.split)
            program = load_program(args.program, trust_code=args.trust_code)
            if config.program.replay_store is not None:  # the config's runs and this one on the same worker samples
                program = program.replaying_on(ReplayStore(config.program.replay_store))
        status.print(f"Running {len(examples)} {args.split} questions…")
        with evaluation_progress():
            evaluation = evaluate(program, examples, config.metric, threads=args.threads, ray=args.ray or config.ray)
    except ConductorError as exc:
        return fail(exc)
    if args.answers is not None:
        evaluation.write_answers(Path(args.answers))
        status.print(f"Each question's result is in {args.answers}")
    result = {"program": args.program, "split": args.split, **evaluation.summary()}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"{args.program} on the {args.split} split")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("accuracy", f"{result['accuracy']:.3f} (n={result['n']})")
    table.add_row("$ per question", f"{result['cost_per_question']:.6f}")
    table.add_row("tokens per question", f"{result['tokens_per_question']:.0f}")
    table.add_row("format-error rate", f"{result['format_error_rate']:.3f}")
    console.print(table)
    return 0


@dataclass(frozen=True)
class Evaluation:
    """A program's results on a split: ``(example, prediction, score)`` per question, in the split's order."""

    program: Any
    results: list[tuple[dspy.Example, dspy.Prediction, float]]

    def summary(self) -> dict[str, Any]:
        """Accuracy (the metric's mean; a question that raised scores 0), cost, tokens and format errors per question,
        and accuracy and count per kind of question when the examples are labelled with one (a mix of benchmarks)."""
        n = len(self.results)
        predictions = [prediction for _, prediction, _ in self.results]
        errors = [getattr(p, "error", None) for p in predictions]
        by_family: dict[str, list[float]] = {}
        for example, _, score in self.results:
            if example.get(LABEL) is not None:
                by_family.setdefault(str(example.get(LABEL)), []).append(float(score))
        return {
            "n": n,
            "accuracy": sum(float(score) for _, _, score in self.results) / n,
            "cost_per_question": sum(getattr(p, "cost", 0.0) or 0.0 for p in predictions) / n,
            "tokens_per_question": sum(getattr(p, "tokens", 0) or 0 for p in predictions) / n,
            "format_error_rate": sum(e is not None and e.kind == "format" for e in errors) / n,
            "by_family": {f: {"accuracy": sum(v) / len(v), "n": len(v)} for f, v in by_family.items()},
        }

    def answers(self) -> list[dict[str, Any]]:
        """Each question's result, as ``--answers`` writes it."""
        rows = []
        for example, prediction, score in self.results:
            workflow, error = prediction.get("workflow"), prediction.get("error")
            row = {
                **example.inputs().toDict(),
                "answer": None if prediction.get("answer") is None else str(prediction.get("answer")),
                "expected": example.get("answer"),
                "score": float(score),
                "workflow": workflow.to_text(self.program.pool.names) if workflow is not None else None,
                "tokens": prediction.get("tokens", 0),
                "cost": prediction.get("cost", 0.0),
            }
            if example.get(LABEL) is not None:
                row[LABEL] = example.get(LABEL)
            if error is not None:
                row["error"] = f"{error.kind}: {error.message}"
            rows.append(row)
        return rows

    def write_answers(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row, default=str) + "\n" for row in self.answers()))

    def workflow_records(self, name: str) -> list[dict[str, Any]]:
        """The records ``conductor.bench.workflow_shapes`` reads: ``name`` as the method, the kind of question as the
        dataset, and the shape of the workflow that answered."""
        return [
            {"method": name, "dataset": str(example.get(LABEL, ALL)), "workflow": workflow_shape(self.program.pool, p)}
            for example, p, _ in self.results
        ]


def evaluate(
    program: Any, examples: list[dspy.Example], metric: Any, *, threads: int, ray: str | None = None
) -> Evaluation:
    """``program`` scored on ``examples`` with ``metric``; with ``ray`` (a cluster address), on that cluster
    (``evaluate_program``)."""
    if not examples:
        raise ConductorError("the split is empty: change data.fractions or data.n")
    return Evaluation(program, evaluate_program(program, examples, metric, threads=threads, ray=ray).results)


def held_out(
    config: Any,
    programs: dict[str, Any],
    validation: dict[str, float],
    test: list[dspy.Example],
    *,
    threads: int,
    ray: str | None = None,
) -> None:
    """Score ``programs`` (before and after training, by name) on the test split, which training never saw; write
    ``held_out.md`` and ``held_out.json`` and print the table, beside each program's ``validation`` accuracy; then the
    workflows each program wrote on the test split, per kind of question."""
    status.print(f"Scoring the {' and the '.join(programs)} program on {len(test)} held-out questions…")
    scored = {name: evaluate(p, test, config.metric, threads=threads, ray=ray) for name, p in programs.items()}
    rows = {name: {"validation_accuracy": validation[name], **e.summary()} for name, e in scored.items()}
    (config.output_dir / "held_out.json").write_text(json.dumps(rows, indent=2))
    families = sorted({f for r in rows.values() for f in r["by_family"]})
    lines = [
        "| program | validation accuracy | test accuracy | n | "
        + "".join(f"{f} | " for f in families)
        + "tokens per question | $ per question | format-error rate |",
        "|---|---|---|---|" + "---|" * len(families) + "---|---|---|",
        *(
            f"| {name} | {r['validation_accuracy']:.3f} | {r['accuracy']:.3f} | {r['n']} | "
            + "".join(f"{r['by_family'][f]['accuracy']:.3f} (n={r['by_family'][f]['n']}) | " for f in families)
            + f"{r['tokens_per_question']:.0f} | {r['cost_per_question']:.6f} | {r['format_error_rate']:.3f} |"
            for name, r in rows.items()
        ),
    ]
    (config.output_dir / "held_out.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines), markup=False, highlight=False)
    records = [record for name, e in scored.items() for record in e.workflow_records(name)]
    kinds = sorted({record["dataset"] for record in records})
    console.print(
        "\nThe workflows each program wrote on the test split, by kind of question (each step as worker[the steps it "
        "saw]):",
        markup=False,
    )
    table = shapes_table(workflow_shapes(records, list(programs), kinds), group="kind")
    console.print("\n".join(table), markup=False, highlight=False, soft_wrap=True)


def fresh_program(config: Any) -> Any:
    """The program as the config builds it, before any training (a fresh policy: training changed its own in
    place)."""
    return config.conductor(config.policy() if config.program.trainable else None)
