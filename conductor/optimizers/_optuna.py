"""Optuna, imported when a feature first needs it, with a message naming the extra that installs it: budget tuning
and MIPROv2's instruction search both use it, and the core package does not need it. ``storage_url`` reads a
storage URL the way the rest of the library reads a database URL."""

from __future__ import annotations

from types import ModuleType

from conductor.errors import MissingDependency

TUNE_EXTRA_HINT = "pip install 'dspy-conductor[tune]'"


def import_optuna(feature: str) -> ModuleType:
    """Optuna, or ``MissingDependency`` naming the extra that installs it."""
    try:
        import optuna
    except ImportError as exc:
        raise MissingDependency(f"{feature} needs Optuna: {TUNE_EXTRA_HINT} ({exc})") from exc
    return optuna


def storage_url(url: str | None) -> str | None:
    """``url`` as Optuna's storage (SQLAlchemy) reads it: a plain ``postgresql://`` URL names psycopg 3, the driver
    ``dspy-conductor[postgres]`` installs (SQLAlchemy would otherwise look for psycopg2). Other URLs pass unchanged."""
    if url is None:
        return None
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url.removeprefix(scheme)
    return url
