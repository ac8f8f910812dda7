"""``conductor bench CONFIG``: run an experiment config (methods x datasets x seeds), resumably, and write its report.

The runner lives in the repository's ``experiments`` package, which is not installed with the library: run the
command from a checkout (its root is put on the import path when the package is found there).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

from conductor.cli._common import console, fail
from conductor.errors import ConductorError, MissingDependency


def register(commands) -> None:
    parser = commands.add_parser("bench", help="run an experiment config and write its table and plot")
    add_arguments(parser)
    parser.set_defaults(handler=handle)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``conductor bench``, shared with ``python -m experiments run``."""
    parser.add_argument("config", metavar="CONFIG", help="an experiment config (YAML)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", dest="fresh", action="store_false", help="skip units already recorded (default)")
    mode.add_argument("--fresh", dest="fresh", action="store_true", help="discard recorded units and start over")
    parser.set_defaults(fresh=False)  # else the first action's default (store_false: True) would win
    parser.add_argument("--threads", type=int, default=None, help="units run at once (default: the config's)")
    parser.add_argument("--n", type=int, default=None, help="examples per dataset, overriding the config's")
    parser.add_argument("--output", default=None, metavar="DIR", help="results folder, overriding the config's")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _runner() -> ModuleType:
    """``experiments.runner``, from the working folder when it is a checkout of the repository."""
    if importlib.util.find_spec("experiments") is None and (Path.cwd() / "experiments" / "runner").is_dir():
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module("experiments.runner")
    except ImportError as exc:
        raise MissingDependency(
            f"`conductor bench` needs the repository's experiments package ({exc}): run it from a checkout's root"
        ) from exc


def handle(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        runner = _runner()
        config = runner.load_config(args.config, n=args.n, threads=args.threads, output=args.output)
        records = runner.run_benchmark(config, fresh=args.fresh, progress=args.progress)
        paths = runner.write_report(config, records)
    except ConductorError as exc:
        return fail(exc)
    console.print(paths["table"].read_text(), markup=False, highlight=False, soft_wrap=True)
    written = ", ".join(map(str, paths.values()))
    console.print(f"{len(records)} units in {time.perf_counter() - started:.0f} s; wrote {written}")
    return 0
