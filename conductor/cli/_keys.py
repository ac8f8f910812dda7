"""``conductor keys add``: make an API key for ``conductor serve --keys``; print it once and store only its hash."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import yaml

from conductor.cli._common import fail, status
from conductor.deploy import KeyStore, hash_key, new_key, read_keys_file
from conductor.errors import ConductorError


def register(commands) -> None:
    parser = commands.add_parser("keys", help="manage the API keys of a served program")
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="make a key, print it once and store its hash in the keys file")
    add.add_argument("--id", required=True, help="the key's name in logs, errors and the audit log")
    add.add_argument("--file", required=True, metavar="FILE", help="the keys file (YAML; made if missing)")
    add.add_argument("--workers", metavar="A,B", help="the workers it may use, comma-separated (default: all)")
    add.add_argument("--max-cost", type=float, metavar="USD", help="the most one request may cost")
    add.add_argument("--max-tokens", type=int, metavar="N", help="the most tokens one request may use")
    add.add_argument("--max-steps", type=int, metavar="N", help="the most steps one request may run")
    add.add_argument("--daily-cost", type=float, metavar="USD", help="dollars per UTC day (needs --max-cost)")
    add.add_argument("--daily-tokens", type=int, metavar="N", help="tokens per UTC day (needs --max-tokens)")
    add.set_defaults(handler=handle_add)


def handle_add(args: argparse.Namespace) -> int:
    path = Path(args.file)
    key = new_key()
    budget = {"max_cost": args.max_cost, "max_tokens": args.max_tokens, "max_steps": args.max_steps}
    entry = {
        "id": args.id,
        "hash": hash_key(key),
        "workers": [name.strip() for name in args.workers.split(",")] if args.workers else None,
        "budget": {name: value for name, value in budget.items() if value is not None} or None,
        "daily_cost": args.daily_cost,
        "daily_tokens": args.daily_tokens,
    }
    try:
        config = read_keys_file(path) if path.exists() else {"keys": []}
        if isinstance(config, dict) and isinstance(config.get("keys"), list):
            config["keys"].append({name: value for name, value in entry.items() if value is not None})
        KeyStore.from_config(config, source=str(path))  # every problem, the new entry's included
    except ConductorError as exc:
        return fail(exc)
    _write(path, yaml.safe_dump(config, sort_keys=False))
    status.print(f"Added key {args.id!r} to {path}. It is shown only this once: store it now.")
    print(key)
    return 0


def _write(path: Path, text: str) -> None:
    """Replace ``path`` at once (a temporary file renamed over it), readable only by its owner."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
