"""The ``conductor`` command. One file per subcommand; each registers its own arguments."""

from __future__ import annotations

import argparse
import logging

from conductor.cli import _bench, _compile, _eval, _keys, _pool, _run, _serve, _train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conductor", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (_run, _pool, _serve, _bench, _keys, _train, _eval, _compile):
        command.register(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return args.handler(args)
