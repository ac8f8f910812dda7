"""``conductor serve [DIR]``: serve a saved program (by default the shipped one) as one model on an
OpenAI-compatible HTTP API (uvicorn).

With ``--keys FILE`` (see ``conductor keys add``), or keys stored in the database, only holders of a key get in. The
database of the audit log, the spend ledger and stored keys (``--db``: a SQLite file, or a ``postgresql://`` URL that
replicas on several machines share; ``docs/replicas.md``) defaults to ``audit/<model>.sqlite`` in the user's data
folder (``$XDG_DATA_HOME/dspy-conductor``, else ``~/.local/share/dspy-conductor``): never inside the installed
package, and kept when the program is saved again.

A run holds one interpreter's GIL for the CPU part of its work, so one process serves a few hundred requests a
second at most; ``--workers N`` serves from N processes (uvicorn's, on one socket), each loading the program, all
writing one audit log and one spend ledger (the database's locking keeps them consistent).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
from pathlib import Path
from typing import Any

from conductor._files import data_dir
from conductor.cli._common import add_threads_argument, add_trust_argument, at_least, fail, status
from conductor.deploy import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    TRAINED_PROGRAM,
    KeyStore,
    create_app,
    import_serving,
    listening_socket,
    load_program,
    safe_url,
    tune_gc_for_serving,
)
from conductor.errors import ConductorError, ConfigError


def register(commands) -> None:
    parser = commands.add_parser("serve", help="serve a saved program on an OpenAI-compatible HTTP API")
    parser.add_argument(
        "dir", metavar="DIR", nargs="?", help="a program folder written by conductor.save (default: the shipped one)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="the model id clients see (default: the folder's name)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, metavar="N")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="seconds per request")
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        metavar="S",
        help="seconds to receive a request's body (then 408)",
    )
    parser.add_argument("--docs", action="store_true", help="serve /docs, /redoc and /openapi.json (behind the keys)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="runs at once per process")
    parser.add_argument("--workers", type=at_least(1), default=1, metavar="N", help="server processes (default: 1)")
    parser.add_argument("--keys", metavar="FILE", help="API keys file (YAML/JSON); without one the server is open")
    parser.add_argument(
        "--db",
        "--audit-db",
        dest="db",
        metavar="URL",
        help="the audit log, spend ledger and stored keys: a SQLite file or a postgresql:// URL replicas share "
        "(default: a SQLite file in the user's data folder)",
    )
    parser.add_argument("--audit-questions", action="store_true", help="keep questions in the audit log, redacted")
    parser.add_argument(
        "--redact", action="append", default=[], metavar="FIELD", help="a request field never audited (repeatable)"
    )
    add_trust_argument(parser)
    add_threads_argument(parser)
    parser.set_defaults(handler=handle)


_SETTINGS = "CONDUCTOR_SERVE_SETTINGS"
"""The environment variable that hands ``serve``'s settings to the processes of ``--workers N``."""


def handle(args: argparse.Namespace) -> int:
    folder = Path(args.dir or TRAINED_PROGRAM).expanduser().absolute()
    model = args.model or folder.name
    settings = {
        "folder": str(folder),
        "trust_code": args.trust_code,
        "keys": args.keys,
        "app": {  # create_app's own options
            "model": model,
            "max_request_bytes": args.max_request_bytes,
            "request_timeout_s": args.timeout,
            "body_timeout_s": args.body_timeout,
            "docs": args.docs,
            "concurrency": args.concurrency,
            "audit_db": str(args.db or data_dir("audit", re.sub(r"[^\w.-]", "_", model) + ".sqlite")),
            "audit_questions": args.audit_questions,
            "sensitive_fields": args.redact,
        },
    }
    try:
        uvicorn = import_serving("uvicorn")
        with status.status("Loading the program…"):  # with --workers too: a bad folder fails here, once
            program, app = _app(settings)
    except ConductorError as exc:
        return fail(exc)
    try:
        sock = _bind(args.host, args.port)  # before "Serving …": a taken port must not look like a started server
    except ConductorError as exc:
        program.pool.close()
        return fail(exc)
    with sock:
        port = sock.getsockname()[1]  # the one the system chose for --port 0
        status.print(f"Serving {model!r} at http://{args.host}:{port}/v1 (POST /v1/chat/completions)")
        status.print(f"Audit log: {safe_url(settings['app']['audit_db'])}", markup=False)
        where = {"host": args.host, "port": port, "log_level": "info" if args.verbose else "warning"}
        if args.workers > 1:  # each process loads its own program: this one only checked the folder
            program.pool.close()
            del program, app
            os.environ[_SETTINGS] = json.dumps(settings)
            config = uvicorn.Config(f"{__name__}:app_from_environment", factory=True, workers=args.workers, **where)
            from uvicorn.supervisors import Multiprocess

            Multiprocess(config, sockets=[sock]).run()
            return 0
        tune_gc_for_serving()
        try:
            uvicorn.Server(uvicorn.Config(app, **where)).run(sockets=[sock])
        finally:
            program.pool.close()
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The socket the server will listen on, bound; a ``ConfigError`` naming the flags to change when it can't be."""
    try:
        return listening_socket(host, port)
    except ConfigError as exc:
        raise ConfigError(f"{exc}: choose another port with --port (or another address with --host)") from None


def app_from_environment():
    """The app of one ``--workers`` process, from the settings ``handle`` left in the environment."""
    app = _app(json.loads(os.environ[_SETTINGS]))[1]
    tune_gc_for_serving()
    return app


def _app(settings: dict[str, Any]):
    """``(program, app)`` for ``settings``."""
    program = load_program(Path(settings["folder"]), trust_code=settings["trust_code"])
    try:
        keys = settings["keys"]
        app = create_app(
            program, keys=KeyStore.from_file(keys, workers=program.pool.names) if keys else None, **settings["app"]
        )
    except BaseException:
        program.pool.close()
        raise
    return program, app
