"""A run's budget: the server's ceiling, lowered by the caller's key and then by the request (``max_tokens``,
``max_completion_tokens``, ``conductor_budget``), and never raised by either."""

import dataclasses
from typing import Any

import pydantic

from conductor.deploy.server._schema import ChatRequest, RequestError
from conductor.errors import validation_problems
from conductor.modules import Budget

BUDGET_FIELDS = tuple(f.name for f in dataclasses.fields(Budget))


def request_budget(ceiling: Budget, chat: ChatRequest) -> Budget:
    """``ceiling`` lowered by the request's ``conductor_budget`` and ``max_tokens`` / ``max_completion_tokens``."""
    budget = _lowered(ceiling, chat.conductor_budget)
    asked = [limit for limit in (chat.max_tokens, chat.max_completion_tokens) if limit is not None]
    return tighter(budget, Budget(max_tokens=min(asked))) if asked else budget


def tighter(ceiling: Budget, cap: Budget) -> Budget:
    """Each of ``ceiling``'s limits, lowered to ``cap``'s where ``cap`` sets one: the smaller where both do (0 is a
    limit of zero, never "no limit"; only ``None`` is)."""
    limits = {}
    for name in BUDGET_FIELDS:
        limit, value = getattr(ceiling, name), getattr(cap, name)
        limits[name] = value if limit is None else limit if value is None else min(limit, value)
    return Budget(**limits)


def _lowered(ceiling: Budget, requested: dict[str, Any] | None) -> Budget:
    """``ceiling`` with each limit the request sets lowered to it; a request can't raise a limit."""
    if not requested:
        return ceiling
    unknown = sorted(set(requested) - set(BUDGET_FIELDS))
    if unknown:
        raise RequestError(
            400,
            f"conductor_budget has unknown fields {unknown}; use {list(BUDGET_FIELDS)}",
            "budget",
            param="conductor_budget",
        )
    try:  # Budget refuses negative, NaN and infinite limits itself
        asked = pydantic.TypeAdapter(Budget).validate_python(requested)
    except pydantic.ValidationError as exc:
        problems = "; ".join(validation_problems(exc, "conductor_budget"))
        raise RequestError(400, f"invalid conductor_budget: {problems}", "budget", param="conductor_budget") from None
    return tighter(ceiling, asked)
