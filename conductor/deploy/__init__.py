"""Deployable programs: save a compiled ``Conductor`` as one folder, load it back, serve it over HTTP.

``save_program`` / ``load_program`` (aliases ``save`` / ``load``, also ``conductor.save`` / ``conductor.load``) need
nothing beyond the core package; ``create_app`` needs FastAPI (``pip install 'dspy-conductor[serve]'``) and imports
it only when called (the server is ``conductor.deploy.server``; ``listening_socket`` is the socket several server
processes share, and ``tune_gc_for_serving`` readies a server process's garbage collector). Governance of a served
program: API keys with allowed workers and budgets (``KeyStore`` from a file, ``StoredKeys`` in the database), daily
spend (``SpendLedger``) and an append-only audit log (``AuditLog``), in one database (``open_database``: a SQLite
file, or PostgreSQL for replicas on several machines). ``conductor_lm`` reads the one way a conductor LM is named
(``tiny``, ``local/<name>``, a model folder or a litellm model), wherever one is.
"""

from pathlib import Path

from conductor.deploy._artifact import FORMAT_VERSION, load_program, load_program_pool, program_digest, save_program
from conductor.deploy._audit import AuditEntry, AuditLog
from conductor.deploy._database import SCHEMA_VERSION, Database, open_database, safe_url
from conductor.deploy._governance import (
    DaySpend,
    KeySpec,
    KeyStore,
    SpendLedger,
    SpendLimitExceeded,
    hash_key,
    new_key,
    read_keys_file,
)
from conductor.deploy._naming import conductor_lm, conductor_policy, is_trainable
from conductor.deploy._stored_keys import StoredKey, StoredKeys
from conductor.deploy._trust import ProgramReview, review_program
from conductor.deploy.server import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    create_app,
    import_serving,
    listening_socket,
    tune_gc_for_serving,
)

load, save = load_program, save_program

TRAINED_PROGRAM = Path(__file__).resolve().parents[1] / "trained" / "local-routing"
"""The trained conductor that ships with the package (``conductor run``'s default): SmolLM2-135M with a LoRA adapter
trained by ``experiments/configs/local_routing.yaml`` over the embedded local pool; its scores are beside it."""

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_TIMEOUT_S",
    "FORMAT_VERSION",
    "SCHEMA_VERSION",
    "TRAINED_PROGRAM",
    "AuditEntry",
    "AuditLog",
    "Database",
    "DaySpend",
    "KeySpec",
    "KeyStore",
    "ProgramReview",
    "SpendLedger",
    "SpendLimitExceeded",
    "StoredKey",
    "StoredKeys",
    "conductor_lm",
    "conductor_policy",
    "create_app",
    "hash_key",
    "import_serving",
    "is_trainable",
    "listening_socket",
    "load",
    "load_program",
    "load_program_pool",
    "new_key",
    "open_database",
    "program_digest",
    "read_keys_file",
    "review_program",
    "safe_url",
    "save",
    "save_program",
    "tune_gc_for_serving",
]
