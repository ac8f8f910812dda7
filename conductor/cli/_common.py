"""What several subcommands share: building the pool from command-line arguments, and reporting."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from conductor.errors import ConductorError
from conductor.modules import WorkerPool

console = Console()  # what the command reports
status = Console(stderr=True)  # progress and errors, so `--json` output on stdout stays clean


def add_pool_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", metavar="FILE", help="a YAML or TOML pool config (default: the embedded local pool)")


def add_trust_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust-code",
        action="store_true",
        help="let the program import code and reach endpoints the library didn't ship (only if you trust its author)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        dest="torch_threads",
        type=at_least(1),
        metavar="N",
        help="torch threads for local models (default: $OMP_NUM_THREADS, else 1 on <= 2 cores, else half the cores)",
    )


def at_least(low: int):
    """An argparse type: an integer no smaller than ``low`` (argparse reports anything else as a usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def load_pool(args: argparse.Namespace) -> WorkerPool:
    return WorkerPool.from_file(args.pool) if args.pool else WorkerPool.default()


def fail(error: ConductorError) -> int:
    """Print a library error as one clear line (no traceback) and return the exit code."""
    status.print(f"[bold red]error:[/] {escape(str(error))}")
    return 2
