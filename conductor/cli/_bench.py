"""``conductor bench CONFIG``: run an experiment config (methods x datasets x seeds), resumably; write its report."""

from __future__ import annotations

import argparse
import time

from conductor.bench import load_config, run_benchmark, write_report
from conductor.cli._common import console, fail
from conductor.errors import ConductorError


def register(commands) -> None:
    parser = commands.add_parser("bench", help="run an experiment config and write its table and plot")
    parser.add_argument("config", metavar="CONFIG", help="an experiment config (YAML)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", dest="fresh", action="store_false", help="skip units already recorded (default)")
    mode.add_argument("--fresh", dest="fresh", action="store_true", help="discard recorded units and start over")
    parser.set_defaults(fresh=False)  # else the first action's default (store_false: True) would win
    parser.add_argument("--threads", type=int, default=None, help="units run at once (default: the config's)")
    parser.add_argument("--n", type=int, default=None, help="examples per dataset, overriding the config's")
    parser.add_argument("--output", default=None, metavar="DIR", help="results folder, overriding the config's")
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run the units on a Ray cluster: 'auto' (the one `ray start` runs here), 'local', or ray://HOST:PORT",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        config = load_config(args.config, n=args.n, threads=args.threads, output=args.output, ray=args.ray)
        records = run_benchmark(config, fresh=args.fresh, progress=args.progress)
        paths = write_report(config, records)
    except ConductorError as exc:
        return fail(exc)
    console.print(paths["table"].read_text(), markup=False, highlight=False, soft_wrap=True)
    written = ", ".join(map(str, paths.values()))
    console.print(f"{len(records)} units in {time.perf_counter() - started:.0f} s; wrote {written}")
    return 0
