"""``conductor run QUESTION``: let the conductor write a workflow for one question, run it, and show every step.

By default the trained conductor that ships with the package answers (a saved program: its LoRA adapter, pool and
limits); ``--program DIR`` runs another saved program, and ``--conductor MODEL`` / ``--pool FILE`` build a fresh,
untrained one instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from conductor.cli._common import (
    add_pool_argument,
    add_threads_argument,
    add_trust_argument,
    at_least,
    console,
    fail,
    load_pool,
    status,
)
from conductor.deploy import conductor_lm
from conductor.errors import ConductorError, ConfigError
from conductor.local import trainable_policy
from conductor.modules import Budget, Conductor

DEFAULT_CONDUCTOR = "local/smollm2-135m-instruct"
FRESH_ONLY = ("max_steps", "max_depth", "free", "temperature", "conductor_max_tokens")
"""Options that shape a fresh conductor; a saved program keeps its own."""


def register(commands) -> None:
    parser = commands.add_parser("run", help="answer one question with a conductor and a worker pool")
    parser.add_argument("question", help="the question or task")
    parser.add_argument(
        "--program", metavar="DIR", help="a saved program folder (default: the trained conductor shipped with this)"
    )
    parser.add_argument(
        "--conductor",
        metavar="MODEL",
        help=f"a fresh conductor instead: a checkpoint folder, local/<name>, tiny or a litellm model (with only "
        f"--pool: {DEFAULT_CONDUCTOR})",
    )
    add_pool_argument(parser)
    parser.add_argument(
        "--free",
        action="store_true",
        help="let a fresh local or trained conductor write freely instead of decoding under the workflow grammar",
    )
    parser.add_argument("--max-steps", type=at_least(1), help="a fresh conductor's step limit (default 5)")
    parser.add_argument("--max-depth", type=at_least(0), help="recursive rounds a fresh conductor may add (default 0)")
    parser.add_argument("--max-tokens", type=int, default=None, help="token budget for the whole run")
    parser.add_argument("--max-cost", type=float, default=None, help="cost budget for the whole run, in dollars")
    parser.add_argument(
        "--conductor-max-tokens", type=at_least(1), help="a fresh conductor's longest workflow (default 384)"
    )
    parser.add_argument("--temperature", type=_temperature, help="a fresh conductor's sampling temperature (default 0)")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON on stdout")
    add_trust_argument(parser)
    add_threads_argument(parser)
    parser.set_defaults(handler=handle)


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 2:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be between 0 and 2, not {text}")
    return value


def handle(args: argparse.Namespace) -> int:
    try:
        _check_text(args.question)
        given = {name: getattr(args, name) for name in ("max_tokens", "max_cost") if getattr(args, name) is not None}
        Budget(**given)  # refuse a limit that is none (NaN, negative) before loading anything
        with status.status("Loading the conductor and its pool…"):
            program = _fresh(args) if args.conductor or args.pool else _saved(args)
            if given:  # only the limits named change: a saved program keeps its others
                program.executor.budget = dataclasses.replace(program.executor.budget, **given)
    except ConductorError as exc:
        return fail(exc)
    try:
        with status.status("The conductor is writing a workflow and the workers are running it…"):
            prediction = program(question=args.question)
    except ConductorError as exc:
        return fail(exc)
    finally:
        program.pool.close()
    if args.json:
        print(json.dumps(_as_json(prediction), indent=2, default=str))
    else:
        _show(prediction, program.pool)
    error = prediction.error
    return 0 if error is None or (error.kind == "format" and prediction.response is not None) else 1


def _check_text(question: str) -> None:
    """Refuse a question that isn't UTF-8 on the command line (Python keeps such bytes as lone surrogates)."""
    try:
        question.encode()
    except UnicodeEncodeError as exc:
        char = ord(question[exc.start])
        what = f"byte 0x{char - 0xDC00:02X}" if 0xDC80 <= char <= 0xDCFF else f"a lone surrogate U+{char:04X}"
        raise ConductorError(
            f"the question is not UTF-8 text: {what} at character {exc.start} (is the terminal set to UTF-8?)"
        ) from None


def _saved(args: argparse.Namespace) -> Conductor:
    from conductor.deploy import TRAINED_PROGRAM, load_program

    given = [f"--{name.replace('_', '-')}" for name in FRESH_ONLY if getattr(args, name) not in (None, False)]
    if given:
        raise ConfigError(f"{', '.join(given)} shape(s) a fresh conductor: add --conductor MODEL, or drop them")
    return load_program(args.program or TRAINED_PROGRAM, trust_code=args.trust_code)


def _fresh(args: argparse.Namespace) -> Conductor:
    if args.program:
        raise ConfigError("--program runs a saved program with its own conductor and pool: drop --conductor/--pool")
    pool = load_pool(args)
    try:
        program = Conductor(pool, max_steps=args.max_steps or 5, max_depth=args.max_depth or 0)
        program.orchestrate.lm = conductor_lm(
            args.conductor or DEFAULT_CONDUCTOR,
            max_tokens=args.conductor_max_tokens or 384,
            temperature=args.temperature or 0.0,
        )
        if not args.free and trainable_policy(program.orchestrate.lm):  # a local or trained one
            from conductor.conductor_lm import constrain_program

            constrain_program(program)  # every workflow it writes is valid
    except BaseException:
        pool.close()
        raise
    return program


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
    """Everything as plain text: what models write (and pool names) may hold ``[...]`` that rich would read as
    markup."""
    if prediction.error and prediction.error.kind == "format":
        text = Text(prediction.conductor_text or "(empty)")
        console.print(Panel(text, title="Conductor output (unusable)", border_style="yellow"))
        console.print(Text(str(prediction.error), style="yellow"))
        if prediction.workflow:
            console.print("[yellow]Fallback: worker 0 answers the question directly.[/]")
    if prediction.workflow:
        table = Table(title="Workflow")
        for column in ("step", "worker", "role", "sees", "subtask"):
            table.add_column(column, overflow="fold")
        for i, step in enumerate(prediction.workflow.steps):
            sees = "all" if step.access == "all" else ", ".join(map(str, step.access)) or "none"
            worker = f"{step.worker} ({pool[step.worker].name})"
            table.add_row(*(Text(cell) for cell in (str(i), worker, step.role or "solve", sees, step.subtask)))
        console.print(table)
    for step in prediction.trace:
        meta = (
            f"{step.prompt_tokens}+{step.completion_tokens} tokens · ${step.cost:.6f} · "
            f"{step.latency_s:.2f} s · {step.attempts} attempt(s)"
        )
        body = Text(step.output or "(empty)") if step.error is None else Text(str(step.error), style="red")
        worker = (
            step.worker if step.answered_by in (None, step.worker) else f"{step.worker}, answered by {step.answered_by}"
        )
        title = escape(f"Step {step.index} · {worker} · {step.role}")
        console.print(Panel(body, title=title, subtitle=meta))
    if prediction.error and prediction.error.kind != "format":
        console.print(Text(str(prediction.error), style="bold red"))
    console.print(Text.assemble(("Answer:", "bold"), f" {prediction.answer}"))
    conductor = prediction.conductor_usage.tokens
    console.print(f"Total: {prediction.tokens} tokens ({conductor} the conductor's) · ${prediction.cost:.6f}")
