"""``conductor serve DIR``: serve a saved program as one model on an OpenAI-compatible HTTP API (uvicorn).

With ``--keys FILE`` (see ``conductor keys add``) only holders of a key get in; the audit log (SQLite) defaults to
``DIR.audit.sqlite`` beside the program's folder, which a later save of the program does not replace.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from conductor.cli._common import add_trust_argument, fail, status
from conductor.deploy import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    KeyStore,
    create_app,
    import_serving,
    load_program,
)
from conductor.errors import ConductorError


def register(commands) -> None:
    parser = commands.add_parser("serve", help="serve a saved program on an OpenAI-compatible HTTP API")
    parser.add_argument("dir", metavar="DIR", help="a program folder written by conductor.save")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="the model id clients see (default: the folder's name)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, metavar="N")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="seconds per request")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="runs at once")
    parser.add_argument("--keys", metavar="FILE", help="API keys file (YAML/JSON); without one the server is open")
    parser.add_argument("--audit-db", metavar="FILE", help="the audit log and spend ledger (default: DIR.audit.sqlite)")
    parser.add_argument("--audit-questions", action="store_true", help="keep questions in the audit log, redacted")
    parser.add_argument(
        "--redact", action="append", default=[], metavar="FIELD", help="a request field never audited (repeatable)"
    )
    add_trust_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        uvicorn = import_serving("uvicorn")
        with status.status("Loading the program…"):
            program = load_program(args.dir, trust_code=args.trust_code)
    except ConductorError as exc:
        return fail(exc)
    try:
        folder = Path(args.dir).expanduser().absolute()
        model = args.model or folder.name
        app = create_app(
            program,
            model=model,
            max_request_bytes=args.max_request_bytes,
            request_timeout_s=args.timeout,
            concurrency=args.concurrency,
            keys=KeyStore.from_file(args.keys, workers=program.pool.names) if args.keys else None,
            audit_db=args.audit_db or folder.with_name(f"{folder.name}.audit.sqlite"),
            audit_questions=args.audit_questions,
            sensitive_fields=args.redact,
        )
        status.print(f"Serving {model!r} at http://{args.host}:{args.port}/v1 (POST /v1/chat/completions)")
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    except ConductorError as exc:
        return fail(exc)
    finally:
        program.pool.close()
    return 0
