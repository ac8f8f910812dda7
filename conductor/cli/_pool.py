"""``conductor pool``: list the workers of a pool as the conductor sees them: a saved program's (by default the
shipped program's, the one ``conductor run`` answers with) or a pool file's."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table
from rich.text import Text

from conductor.cli._common import add_trust_argument, console, fail
from conductor.errors import ConductorError
from conductor.modules import WorkerPool


def register(commands) -> None:
    parser = commands.add_parser("pool", help="list the workers of a saved program's pool, or of a pool file")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--program", metavar="DIR", help="a saved program folder (default: the trained program `conductor run` uses)"
    )
    source.add_argument("--pool", metavar="FILE", help="a YAML or TOML pool config")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_trust_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        pool = _pool(args)
    except ConductorError as exc:
        return fail(exc)
    rows = [
        {
            "id": i,
            "name": w.name,
            "kind": type(w).__name__,
            "description": w.description,
            "price_in_per_1k": w.price.input_per_1k if w.price else None,  # None: unknown to litellm
            "price_out_per_1k": w.price.output_per_1k if w.price else None,
            "max_tokens": w.max_tokens,
            "timeout_s": w.timeout_s,
            "retries": w.retries,
            "fallbacks": list(pool.fallbacks.get(w.name, ())),  # who takes its steps while it fails
        }
        for i, w in enumerate(pool)
    ]
    if args.json:
        print(json.dumps({"show_descriptions": pool.show_descriptions, "workers": rows}, indent=2))
        return 0
    console.print(_table(rows, pool.show_descriptions))
    return 0


_PRICES = ("price_in_per_1k", "price_out_per_1k")


def _table(rows: list[dict[str, Any]], show_descriptions: bool) -> Table:
    """The rows as a table that stays whole at any width: the prices and the limits share a column each, so that
    80 columns leave the names room, and a cell too narrow folds its text rather than cut it."""
    shown = "descriptions shown" if show_descriptions else "ids only"
    table = Table(title=f"Worker pool ({shown} to the conductor)")
    for column in ("id", "name", "kind", "description", "$/1K in / out", "limits per call"):
        table.add_column(column, overflow="fold")
    for row in rows:
        kind = row["kind"].removesuffix("Worker") or row["kind"]  # CalculatorWorker: Calculator
        prices = " / ".join(str(row[key]) if row[key] is not None else "unknown" for key in _PRICES)
        limits = f"{row['max_tokens']} tokens, {row['timeout_s']:g} s, {row['retries']} retries"
        if row["fallbacks"]:
            limits += ", then " + ", ".join(row["fallbacks"])
        cells = (row["id"], row["name"], kind, row["description"], prices, limits)
        table.add_row(*(Text(str(cell)) for cell in cells))  # names are data, not rich markup
    return table


def _pool(args: argparse.Namespace) -> WorkerPool:
    if args.pool:
        return WorkerPool.from_file(args.pool)
    from conductor.deploy import TRAINED_PROGRAM, load_program_pool

    return load_program_pool(args.program or TRAINED_PROGRAM, trust_code=args.trust_code)
