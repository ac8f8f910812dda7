"""``conductor run QUESTION``: let the conductor write a workflow for one question, run it, and show every step."""

from __future__ import annotations

import argparse
import dataclasses
import json

from rich.panel import Panel
from rich.table import Table

from conductor.cli._common import add_pool_argument, conductor_lm, console, fail, load_pool, status
from conductor.errors import ConductorError
from conductor.modules import Budget, Conductor

DEFAULT_CONDUCTOR = "local/smollm2-135m-instruct"


def register(commands) -> None:
    parser = commands.add_parser("run", help="answer one question with a conductor and a worker pool")
    parser.add_argument("question", help="the question or task")
    add_pool_argument(parser)
    parser.add_argument(
        "--conductor",
        default=DEFAULT_CONDUCTOR,
        metavar="MODEL",
        help=f"conductor: a trained checkpoint folder, local/<name> or a litellm model (default: {DEFAULT_CONDUCTOR})",
    )
    parser.add_argument(
        "--free",
        action="store_true",
        help="let a local or trained conductor write freely instead of decoding under the workflow grammar",
    )
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument(
        "--max-depth",
        type=int,
        default=0,
        help="recursive rounds the conductor may add (needs --free with a local one)",
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="token budget for the whole run")
    parser.add_argument("--max-cost", type=float, default=None, help="cost budget for the whole run, in dollars")
    parser.add_argument("--conductor-max-tokens", type=int, default=384)
    parser.add_argument("--temperature", type=float, default=0.0, help="the conductor's sampling temperature")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON on stdout")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        with status.status("Loading the pool…"):
            pool = load_pool(args)
    except ConductorError as exc:
        return fail(exc)
    try:
        with status.status("Loading the conductor…"):
            budget = Budget(max_tokens=args.max_tokens, max_cost=args.max_cost)
            program = Conductor(pool, max_steps=args.max_steps, max_depth=args.max_depth, budget=budget)
            program.orchestrate.lm = conductor_lm(
                args.conductor, max_tokens=args.conductor_max_tokens, temperature=args.temperature
            )
            if not args.free and getattr(program.orchestrate.lm.engine, "policy", None):  # a local or trained one
                from conductor.conductor_lm import constrain_program

                constrain_program(program)  # every workflow it writes is valid
        with status.status("The conductor is writing a workflow and the workers are running it…"):
            prediction = program(question=args.question)
    except ConductorError as exc:
        return fail(exc)
    finally:
        pool.close()
    if args.json:
        print(json.dumps(_as_json(prediction), indent=2, default=str))
    else:
        _show(prediction, pool)
    error = prediction.error
    return 0 if error is None or (error.kind == "format" and prediction.response is not None) else 1


def _as_json(prediction) -> dict:
    workflow = prediction.workflow
    return {
        "answer": prediction.answer,
        "response": prediction.response,
        "error": dataclasses.asdict(prediction.error) if prediction.error else None,
        "workflow": workflow.to_text() if workflow else None,
        "conductor_text": prediction.conductor_text,
        "steps": [dataclasses.asdict(step) for step in prediction.trace],
        "tokens": prediction.tokens,
        "cost": prediction.cost,
    }


def _show(prediction, pool) -> None:
    if prediction.error and prediction.error.kind == "format":
        console.print(
            Panel(prediction.conductor_text or "(empty)", title="Conductor output (unusable)", border_style="yellow")
        )
        console.print(f"[yellow]{prediction.error}[/]")
        if prediction.workflow:
            console.print("[yellow]Fallback: worker 0 answers the question directly.[/]")
    if prediction.workflow:
        table = Table(title="Workflow")
        for column in ("step", "worker", "role", "sees", "subtask"):
            table.add_column(column, overflow="fold")
        for i, step in enumerate(prediction.workflow.steps):
            sees = "all" if step.access == "all" else ", ".join(map(str, step.access)) or "none"
            worker = f"{step.worker} ({pool[step.worker].name})"
            table.add_row(str(i), worker, step.role or "solve", sees, step.subtask)
        console.print(table)
    for step in prediction.trace:
        meta = (
            f"{step.prompt_tokens}+{step.completion_tokens} tokens · ${step.cost:.6f} · "
            f"{step.latency_s:.2f} s · {step.attempts} attempt(s)"
        )
        body = step.output if step.error is None else f"[red]{step.error}[/]"
        console.print(Panel(body or "(empty)", title=f"Step {step.index} · {step.worker} · {step.role}", subtitle=meta))
    if prediction.error and prediction.error.kind != "format":
        console.print(f"[bold red]{prediction.error}[/]")
    console.print(f"[bold]Answer:[/] {prediction.answer}")
    console.print(f"Total: {prediction.tokens} worker tokens · ${prediction.cost:.6f}")
