"""What several subcommands share: building the pool from command-line arguments, and reporting."""

from __future__ import annotations

import argparse

from rich.console import Console

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


def load_pool(args: argparse.Namespace) -> WorkerPool:
    return WorkerPool.from_file(args.pool) if args.pool else WorkerPool.default()


def fail(error: Exception) -> int:
    """Print a library error as one clear line (no traceback) and return the exit code."""
    kind = "error" if isinstance(error, ConductorError) else type(error).__name__
    status.print(f"[bold red]{kind}:[/] {error}")
    return 2
