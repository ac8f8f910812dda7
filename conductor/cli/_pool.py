"""``conductor pool``: list the workers of a pool as the conductor sees them."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from conductor.cli._common import add_pool_argument, console, fail, load_pool
from conductor.errors import ConductorError


def register(commands) -> None:
    parser = commands.add_parser("pool", help="list the workers of a pool")
    add_pool_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        pool = load_pool(args)
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
        }
        for i, w in enumerate(pool)
    ]
    if args.json:
        print(json.dumps({"show_descriptions": pool.show_descriptions, "workers": rows}, indent=2))
        return 0
    shown = "descriptions shown" if pool.show_descriptions else "ids only"
    table = Table(title=f"Worker pool ({shown} to the conductor)")
    for column in ("id", "name", "kind", "description", "$/1K in", "$/1K out", "max tokens", "timeout s", "retries"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)
    return 0
