"""``python -m experiments run CONFIG``: the experiment runner (the same as ``conductor bench CONFIG``)."""

from __future__ import annotations

import argparse
import logging
import sys

from conductor.cli import _bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the runner does")
    commands = parser.add_subparsers(dest="command", required=True)
    _bench.add_arguments(commands.add_parser("run", help="run an experiment config and write its table and plot"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return _bench.handle(args)


if __name__ == "__main__":
    sys.exit(main())
