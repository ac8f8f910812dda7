"""``conductor search CONFIG``: program search alone, on the config's train split: which candidate workflow answers
which questions, at what cost. Writes the oracle table and per-question scores to ``OUTPUT_DIR/search`` and prints
the table; running it again with the same folder resumes. ``conductor compile`` runs the same search as its first
phase (with a ``search`` section) and then teaches the winners to the conductor."""

from __future__ import annotations

import argparse

from conductor.cli._common import at_least, console, fail, status
from conductor.cli._eval import add_ray_argument
from conductor.errors import ConductorError


def register(commands) -> None:
    parser = commands.add_parser("search", help="score candidate workflows on a config's train split; print the table")
    parser.add_argument("config", metavar="CONFIG", help="a run config (YAML); its `search` section, if any, is used")
    parser.add_argument(
        "--max-worker-calls", type=at_least(1), metavar="N", help="the most worker calls (overrides the config)"
    )
    add_ray_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from conductor.cli._config import load_run_config  # imports torch: only when run
    from conductor.optimizers import ProgramSearchConfig, program_search, write_search_report

    try:
        config = load_run_config(args.config)
        search = config.search or ProgramSearchConfig()
        if args.max_worker_calls is not None:
            search = search.model_copy(update={"max_worker_calls": args.max_worker_calls})
        with status.status("Loading the data and the pool…"):
            splits = config.splits()
            program = config.conductor(config.policy() if config.program.trainable else None)
        folder = config.output_dir / "search"
        ray = args.ray or config.ray
        result = program_search(program, splits.train, config.metric, search, output_dir=folder, progress=True, ray=ray)
        write_search_report(result, folder, label=search.label)
    except ConductorError as exc:
        return fail(exc)
    console.print((folder / "oracle.md").read_text(), markup=False, highlight=False)
    status.print(f"Per-question scores and winners are in {folder}")
    return 0
