"""Deployable programs: save a compiled ``Conductor`` as one folder, load it back, serve it over HTTP.

``save_program`` / ``load_program`` (alias ``load``) need nothing beyond the core package; ``create_app`` needs
FastAPI (``pip install 'dspy-conductor[serve]'``) and imports it only when called. Governance of a served program:
API keys with allowed workers and budgets (``KeyStore``, ``SpendLedger``) and an append-only audit log (``AuditLog``).
"""

from pathlib import Path

from conductor.deploy._artifact import FORMAT_VERSION, load_program, save_program
from conductor.deploy._audit import AuditEntry, AuditLog
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
from conductor.deploy._server import create_app

load = load_program

TRAINED_PROGRAM = Path(__file__).resolve().parents[1] / "trained" / "local-routing"
"""The trained conductor that ships with the package (``conductor run``'s default): SmolLM2-135M with a LoRA adapter
trained by ``experiments/configs/local_routing.yaml`` over the embedded local pool; its scores are beside it."""

__all__ = [
    "FORMAT_VERSION",
    "TRAINED_PROGRAM",
    "AuditEntry",
    "AuditLog",
    "DaySpend",
    "KeySpec",
    "KeyStore",
    "SpendLedger",
    "SpendLimitExceeded",
    "create_app",
    "hash_key",
    "load",
    "load_program",
    "new_key",
    "read_keys_file",
    "save_program",
]
