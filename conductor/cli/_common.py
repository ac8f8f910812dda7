"""What several subcommands share: building the pool from command-line arguments, and reporting: results on stdout;
progress bars, log lines and errors on stderr."""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

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


class ConsoleLogHandler(logging.Handler):
    """Log records printed through ``status``: above a progress bar while one is drawn, not through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            status.print(Text(self.format(record)), soft_wrap=True)
        except Exception:
            self.handleError(record)


class RepeatedWarnings(logging.Filter):
    """Lets each distinct warning through once and counts the rest: libraries such as dspy warn once per call
    ("LM response was truncated"), which buried everything else. ``report`` prints the counts."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[tuple[str, str]] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        if not hasattr(record, "occurrence"):  # counted once, though it may reach two handlers (LiteLLM's and ours)
            key = (record.levelname, record.getMessage())
            self.counts[key] += 1
            record.occurrence = self.counts[key]
        return record.occurrence == 1

    def report(self) -> None:
        """One line per warning shown more than once, with how often it came; then start counting afresh."""
        for (level, message), count in self.counts.items():
            if count > 1:
                status.print(Text(f"{level} ({count} times, shown once) {message.splitlines()[0]}"), soft_wrap=True)
        self.counts.clear()


repeated_warnings = RepeatedWarnings()  # the CLI's log handler carries it (``configure_logging``)


class EvaluationProgress(BaseCallback):
    """A bar with an ETA on stderr for each ``dspy.Evaluate`` run (a split scored, a compile phase's validation
    score), a step per question its program answers, unless dspy draws its own. Evaluations run one at a time here,
    and each draws its bar only while it runs, so it never draws over the bars of program search (rich) and GRPO
    (tqdm)."""

    def __init__(self) -> None:
        self.program: Any = None
        self.questions: set[str] = set()  # the ids of the evaluated program's calls under way
        self.bar: Progress | None = None
        self.task = TaskID(0)

    def on_evaluate_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        asked = inputs.get("display_progress")
        if asked if asked is not None else instance.display_progress:  # dspy draws its own (prompt search asks it)
            return
        self.program = inputs["program"]
        total = len(inputs.get("devset") or instance.devset)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.bar = Progress(*columns, TimeRemainingColumn(), console=status)
        self.task = self.bar.add_task("questions answered", total=total)
        self.bar.start()

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if instance is self.program:
            self.questions.add(call_id)

    def on_module_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        if call_id in self.questions:
            self.questions.discard(call_id)
            self.bar.advance(self.task)

    def on_evaluate_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        if self.program is not None:
            self.program = None
            self.bar.stop()


@contextmanager
def evaluation_progress() -> Iterator[None]:
    """Draw ``EvaluationProgress`` bars for the evaluations run inside (``dspy.Evaluate``'s threads inherit it)."""
    with dspy.context(callbacks=[*dspy.settings.get("callbacks", []), EvaluationProgress()]):
        yield
