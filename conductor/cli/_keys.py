"""``conductor keys add|list|revoke``: the API keys of ``conductor serve``, in a keys file (``--file``, read when a
server starts) or in the server's database (``--db``, read on every request, so a revoked key is refused at once by
every replica). A new key is printed once; only its hash is stored."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path

import yaml
from rich.table import Table

from conductor.cli._common import console, fail, status
from conductor.deploy import KeySpec, KeyStore, StoredKeys, hash_key, new_key, read_keys_file
from conductor.errors import ConductorError, ConfigError


def register(commands) -> None:
    parser = commands.add_parser("keys", help="manage the API keys of a served program")
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="make a key, print it once and store its hash")
    _add_where(add)
    add.add_argument("--id", required=True, help="the key's name in logs, errors and the audit log")
    add.add_argument("--workers", metavar="A,B", help="the workers it may use, comma-separated (default: all)")
    add.add_argument("--max-cost", type=float, metavar="USD", help="the most one request may cost")
    add.add_argument("--max-tokens", type=int, metavar="N", help="the most tokens one request may use")
    add.add_argument("--max-steps", type=int, metavar="N", help="the most steps one request may run")
    add.add_argument("--daily-cost", type=float, metavar="USD", help="dollars per UTC day (needs --max-cost)")
    add.add_argument("--daily-tokens", type=int, metavar="N", help="tokens per UTC day (needs --max-tokens)")
    add.set_defaults(handler=handle_add)
    listing = actions.add_parser("list", help="the keys (never the keys themselves: ids, workers and limits)")
    _add_where(listing)
    listing.set_defaults(handler=handle_list)
    revoke = actions.add_parser("revoke", help="refuse a key from now on")
    revoke.add_argument("name", metavar="NAME", help="the key's id")
    _add_where(revoke)
    revoke.set_defaults(handler=handle_revoke)


def _add_where(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--file", metavar="FILE", help="a keys file (YAML; made if missing), read when a server starts")
    where.add_argument(
        "--db", metavar="URL", help="the servers' database (a SQLite path or postgresql:// URL), read on each request"
    )


def handle_add(args: argparse.Namespace) -> int:
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
    entry = {name: value for name, value in entry.items() if value is not None}
    try:
        if args.db:
            [spec] = KeyStore.from_config({"keys": [entry]}, source="the new key").keys  # every problem at once
            with contextlib.closing(StoredKeys(args.db)) as stored:
                stored.add(spec)
            where = stored.database.name
        else:
            where = _add_to_file(Path(args.file), entry)
    except ConductorError as exc:
        return fail(exc)
    status.print(f"Added key {args.id!r} to {where}. It is shown only this once: store it now.", markup=False)
    print(key)
    return 0


def handle_list(args: argparse.Namespace) -> int:
    try:
        if args.db:
            with contextlib.closing(StoredKeys(args.db)) as stored:
                entries = [(key.spec, key.created, key.revoked) for key in stored.entries()]
        else:
            entries = [(spec, None, None) for spec in KeyStore.from_file(args.file)]
    except ConductorError as exc:
        return fail(exc)
    table = Table("id", "workers", "per request", "per day", *(("added", "revoked") if args.db else ()))
    for spec, created, revoked in entries:
        row = [spec.id, ", ".join(spec.workers) if spec.workers is not None else "all", *_limits(spec)]
        table.add_row(*row, *((created, revoked or "") if args.db else ()))
    console.print(table)
    return 0


def handle_revoke(args: argparse.Namespace) -> int:
    try:
        if args.db:
            with contextlib.closing(StoredKeys(args.db)) as stored:
                stored.revoke(args.name)
            status.print(f"Revoked key {args.name!r}: every server on {stored.database.name} refuses it now.")
            return 0
        config = read_keys_file(args.file)
        KeyStore.from_config(config, source=args.file)
        kept = [entry for entry in config["keys"] if entry["id"] != args.name]
        if len(kept) == len(config["keys"]):
            raise ConfigError(f"no key {args.name!r} in {args.file}")
    except ConductorError as exc:
        return fail(exc)
    _write(Path(args.file), yaml.safe_dump({**config, "keys": kept}, sort_keys=False))
    status.print(f"Removed key {args.name!r} from {args.file}; servers refuse it once restarted.", markup=False)
    return 0


def _add_to_file(path: Path, entry: dict) -> Path:
    """Append ``entry`` to the keys file at ``path`` after checking the whole file with it; return ``path``."""
    config = read_keys_file(path) if path.exists() else {"keys": []}
    if isinstance(config, dict) and isinstance(config.get("keys"), list):
        config["keys"].append(entry)
    KeyStore.from_config(config, source=str(path))  # every problem, the new entry's included
    _write(path, yaml.safe_dump(config, sort_keys=False))
    return path


def _limits(spec: KeySpec) -> tuple[str, str]:
    """A key's per-request budget and daily limits, as table cells."""
    budget = spec.budget
    per_request = [f"${budget.max_cost:g}" if budget.max_cost is not None else None]
    per_request += [f"{budget.max_tokens:,} tokens" if budget.max_tokens is not None else None]
    per_request += [f"{budget.max_steps} steps" if budget.max_steps is not None else None]
    per_day = [f"${spec.daily_cost:g}" if spec.daily_cost is not None else None]
    per_day += [f"{spec.daily_tokens:,} tokens" if spec.daily_tokens is not None else None]
    return ", ".join(filter(None, per_request)) or "-", ", ".join(filter(None, per_day)) or "-"


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
