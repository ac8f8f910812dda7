"""The ``conductor`` command. One file per subcommand; each registers its own arguments.

Besides ``main``, the config file of ``train``, ``eval`` and ``compile`` is public (``load_run_config``,
``RunConfig``), for scripts that read what a run used (its data splits, its program); they are imported on first use,
as they import torch, which ``conductor --help`` should not wait for.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from conductor._version import __version__
from conductor.cli import _bench, _compile, _eval, _keys, _pool, _run, _search, _serve, _train
from conductor.cli._common import ConsoleLogHandler, fail, repeated_warnings, status
from conductor.errors import ConductorError

RUN_CONFIG_NAMES = ("RunConfig", "load_run_config")
"""The public names of ``_config.py``, imported when first asked for (``__getattr__``)."""

DESCRIPTION = "A trainable conductor LM that writes and runs workflows over a pool of workers."
EPILOG = (
    'Start with: conductor run "What is 17 * 23 + 4?" (the shipped conductor and the embedded local pool). '
    "Exit codes: 0 done, 1 `run` ended without an answer, 2 bad input or config (one line on stderr, "
    "argparse's usage errors too), 3 an internal error, 130 interrupted."
)
LOG_HANDLER = "conductor-cli"
THIRD_PARTY_LOGGERS = ("dspy", "LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx", "transformers", "peft", "torch")
"""Libraries whose warnings are noise in normal output (truncation notes, banners); ``--verbose`` shows them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``conductor`` command's parser, every subcommand registered (the docs' CLI reference is made from it)."""
    parser = argparse.ArgumentParser(prog="conductor", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s (dspy-conductor) {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library and its dependencies do")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (_run, _pool, _serve, _bench, _keys, _train, _eval, _search, _compile):
        command.register(commands)
    for subcommand in commands.choices.values():  # also after the subcommand, as the error messages suggest
        subcommand.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="as above")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    if hasattr(args, "torch_threads"):  # run and serve; eval, compile and bench size their own parallelism
        use_torch_threads(args.torch_threads)
    try:
        return args.handler(args)
    except ConductorError as exc:  # a subcommand that doesn't catch its own
        return fail(exc)
    except KeyboardInterrupt:
        status.print("interrupted")
        return 130
    except Exception as exc:  # a bug, not bad input: still one line unless asked for the traceback
        if args.verbose:
            raise
        status.print(
            f"internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback)", markup=False
        )
        return 3
    finally:
        repeated_warnings.report()


def configure_logging(verbose: bool) -> None:
    """The library's own warnings always; its info, and other libraries' warnings and progress bars, with
    ``verbose`` (errors always show); a warning repeated is shown once and counted (``main`` prints the counts).
    Calling it again (``main`` run in-process) reconfigures, adds nothing."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if h.get_name() == LOG_HANDLER), None)
    if handler is None:
        handler = ConsoleLogHandler()
        handler.set_name(LOG_HANDLER)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        root.addHandler(handler)
    repeated_warnings.counts.clear()
    handler.filters = [repeated_warnings] if verbose else [_own_or_error, repeated_warnings]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.captureWarnings(True)  # Python warnings (peft, transformers) become "py.warnings" records
    for name in THIRD_PARTY_LOGGERS:  # those that write through handlers of their own
        logger = logging.getLogger(name)
        logger.setLevel(logging.NOTSET if verbose else logging.ERROR)
        for own in logger.handlers:  # dspy's warns on every truncated LM call
            if own not in root.handlers:  # a library may share the root's (a test's log capture among them)
                own.addFilter(repeated_warnings)
    if not verbose:  # transformers and huggingface_hub read these when imported
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _own_or_error(record: logging.LogRecord) -> bool:
    return record.name == "conductor" or record.name.startswith("conductor.") or record.levelno >= logging.ERROR


def use_torch_threads(threads: int | None) -> None:
    """Set torch's threads for local models: ``threads``, else ``$OMP_NUM_THREADS``, else ``default_threads()``.
    (torch's own default, every core, made a conductor call 20x slower on a loaded 2-core machine.)"""
    if threads is None:
        given = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else default_threads()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # torch reads it when first imported
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def default_threads() -> int:
    """1 on a machine with at most 2 cores, else half of them (the rest for the tokenizer, workers and the OS)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if cores <= 2 else cores // 2


def __getattr__(name: str) -> Any:
    """``load_run_config`` and ``RunConfig`` on first use (see the module docstring)."""
    if name in RUN_CONFIG_NAMES:
        from conductor.cli import _config

        return getattr(_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
