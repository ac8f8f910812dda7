"""What several subcommands share: building the pool and the conductor LM from command-line arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

import dspy
from rich.console import Console

from conductor.errors import ConductorError
from conductor.modules import WorkerPool

console = Console()  # what the command reports
status = Console(stderr=True)  # progress and errors, so `--json` output on stdout stays clean


def add_pool_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", metavar="FILE", help="a YAML or TOML pool config (default: the embedded local pool)")


def load_pool(args: argparse.Namespace) -> WorkerPool:
    return WorkerPool.from_file(args.pool) if args.pool else WorkerPool.default()


def conductor_lm(model: str, *, max_tokens: int, temperature: float) -> dspy.LM:
    """The conductor LM a command line names: a folder saved by ``ConductorLM.save`` (a trained conductor),
    ``local/<name>`` (an embedded local model), or else a litellm model string."""
    path = Path(model).expanduser()
    if not (path.is_dir() or model.startswith("local/")):
        return dspy.LM(model, max_tokens=max_tokens, temperature=temperature, cache=False)
    from conductor.conductor_lm import ConductorLM  # torch and peft, only for these

    if path.is_dir():
        policy = ConductorLM.load(path)
    else:
        policy = ConductorLM.from_pretrained(model.removeprefix("local/"), lora=None)
    return policy.as_dspy_lm(temperature=temperature, max_tokens=max_tokens)


def fail(error: Exception) -> int:
    """Print a library error as one clear line (no traceback) and return the exit code."""
    kind = "error" if isinstance(error, ConductorError) else type(error).__name__
    status.print(f"[bold red]{kind}:[/] {error}")
    return 2
