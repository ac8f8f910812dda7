"""Optuna, imported when a feature first needs it, with a message naming the extra that installs it: budget tuning
and MIPROv2's instruction search both use it, and the core package does not need it."""

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
