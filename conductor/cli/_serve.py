"""``conductor serve [DIR]``: serve a saved program (by default the shipped one) as one model on an
OpenAI-compatible HTTP API (uvicorn).

With ``--keys FILE`` (see ``conductor keys add``) only holders of a key get in; the audit log (SQLite) defaults to
``audit/<model>.sqlite`` in the user's data folder (``$XDG_DATA_HOME/dspy-conductor``, else
``~/.local/share/dspy-conductor``): never inside the installed package, and kept when the program is saved again.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from conductor._files import data_dir
from conductor.cli._common import add_threads_argument, add_trust_argument, fail, status
from conductor.deploy import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    TRAINED_PROGRAM,
    KeyStore,
    create_app,
    import_serving,
    load_program,
)
from conductor.errors import ConductorError


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
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="runs at once")
    parser.add_argument("--keys", metavar="FILE", help="API keys file (YAML/JSON); without one the server is open")
    parser.add_argument(
        "--audit-db", metavar="FILE", help="the audit log and spend ledger (default: in the user's data folder)"
    )
    parser.add_argument("--audit-questions", action="store_true", help="keep questions in the audit log, redacted")
    parser.add_argument(
        "--redact", action="append", default=[], metavar="FIELD", help="a request field never audited (repeatable)"
    )
    add_trust_argument(parser)
    add_threads_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    folder = Path(args.dir or TRAINED_PROGRAM).expanduser().absolute()
    try:
        uvicorn = import_serving("uvicorn")
        with status.status("Loading the program…"):
            program = load_program(folder, trust_code=args.trust_code)
    except ConductorError as exc:
        return fail(exc)
    try:
        model = args.model or folder.name
        audit_db = args.audit_db or data_dir("audit", re.sub(r"[^\w.-]", "_", model) + ".sqlite")
        app = create_app(
            program,
            model=model,
            max_request_bytes=args.max_request_bytes,
            request_timeout_s=args.timeout,
            concurrency=args.concurrency,
            keys=KeyStore.from_file(args.keys, workers=program.pool.names) if args.keys else None,
            audit_db=audit_db,
            audit_questions=args.audit_questions,
            sensitive_fields=args.redact,
        )
        status.print(f"Serving {model!r} at http://{args.host}:{args.port}/v1 (POST /v1/chat/completions)")
        status.print(f"Audit log: {audit_db}", markup=False)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    except ConductorError as exc:
        return fail(exc)
    finally:
        program.pool.close()
    return 0
