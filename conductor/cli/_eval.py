"""``conductor eval PROGRAM_DIR --config CONFIG``: score a saved program on one split of the config's data.

Prints accuracy (over n questions), dollars and tokens per question and the share of workflows that didn't parse.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import dspy
from rich.table import Table

from conductor.cli._common import add_trust_argument, console, fail, status
from conductor.deploy import load_program
from conductor.errors import ConductorError
from conductor.optimizers import evaluate_program


def register(commands) -> None:
    parser = commands.add_parser("eval", help="score a saved program on a split of a config's data")
    parser.add_argument("program", metavar="PROGRAM_DIR", help="a saved program folder (e.g. OUTPUT_DIR/program)")
    parser.add_argument("--config", required=True, metavar="CONFIG", help="the run config naming data and metric")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test")
    parser.add_argument("--threads", type=int, default=1, help="questions run at once (in each Ray task with --ray)")
    add_ray_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
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
        config = load_run_config(args.config)
        with status.status("Loading the data and the program…"):
            examples = getattr(config.splits(), args.split)
            program = load_program(args.program, trust_code=args.trust_code)
        with status.status(f"Running {len(examples)} {args.split} questions…"):
            result = evaluate(program, examples, config.metric, threads=args.threads, ray=args.ray or config.ray)
    except ConductorError as exc:
        return fail(exc)
    result = {"program": args.program, "split": args.split, **result}
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


def evaluate(
    program: dspy.Module, examples: list[dspy.Example], metric: Any, *, threads: int, ray: str | None = None
) -> dict[str, Any]:
    """Accuracy (the metric's mean; a question that raised scores 0), cost, tokens and format errors per question;
    with ``ray`` (a cluster address) scored on that cluster (``evaluate_program``)."""
    if not examples:
        raise ConductorError("the split is empty: change data.fractions or data.n")
    results = evaluate_program(program, examples, metric, threads=threads, ray=ray).results
    n = len(results)
    predictions = [prediction for _, prediction, _ in results]
    errors = [getattr(p, "error", None) for p in predictions]
    by_family: dict[str, list[float]] = {}
    for example, _, score in results:
        by_family.setdefault(str(example.get("family")), []).append(float(score))
    return {
        "n": n,
        "accuracy": sum(float(score) for _, _, score in results) / n,
        "cost_per_question": sum(getattr(p, "cost", 0.0) or 0.0 for p in predictions) / n,
        "tokens_per_question": sum(getattr(p, "tokens", 0) or 0 for p in predictions) / n,
        "format_error_rate": sum(e is not None and e.kind == "format" for e in errors) / n,
        # accuracy and count per task family, when the examples are labelled with one (a mix of benchmarks)
        "by_family": {f: {"accuracy": sum(v) / len(v), "n": len(v)} for f, v in by_family.items() if f != "None"},
    }
