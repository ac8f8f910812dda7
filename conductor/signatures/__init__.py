"""Worker roles and the conductor's signature, as DSPy signatures."""

from conductor.signatures._orchestrate import Orchestrate, Revise
from conductor.signatures._roles import (
    BUILTIN_ROLES,
    ROLE_INPUTS,
    Aggregate,
    Plan,
    Refine,
    Solve,
    Verify,
    role_name,
    role_problems,
)

__all__ = [
    "BUILTIN_ROLES",
    "ROLE_INPUTS",
    "Aggregate",
    "Orchestrate",
    "Plan",
    "Refine",
    "Revise",
    "Solve",
    "Verify",
    "role_name",
    "role_problems",
]
