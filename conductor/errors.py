"""One exception family for the whole library, so callers can catch ``ConductorError``."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any

import pydantic


class ConductorError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigError(ConductorError, ValueError):
    """A pool, budget or program configuration is invalid. The message lists every problem at once."""


class WorkflowError(ConductorError, ValueError):
    """The conductor's text is not a usable workflow: it can't be parsed, or it breaks a rule of the pool or limits.

    ``problems`` holds every problem found, so a caller (or a reward) sees them all, not just the first.
    """

    def __init__(self, problems: list[str], text: str | None = None):
        self.problems = list(problems)
        self.text = text
        super().__init__("; ".join(self.problems))


class WorkerError(ConductorError, RuntimeError):
    """A worker failed to produce a completion (provider error, crash, bad output).

    ``retryable`` says whether trying again may succeed; the executor retries only those. Subclasses set the
    default for their kind, and one error may override it.
    """

    retryable = True

    def __init__(self, message: str, *, retryable: bool | None = None):
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class WorkerTimeout(WorkerError, TimeoutError):
    """A worker did not answer within its wall-clock limit."""


class ToolInputError(WorkerError):
    """A tool can't use its input (no code block, a malformed expression): the same input would fail again."""

    retryable = False


class CodeTimeout(WorkerTimeout):
    """Code in the sandbox ran past its time limit and was stopped: the same code would run as long again."""

    retryable = False


class BudgetExceeded(ConductorError):
    """The next call would go past the run's budget of steps, tokens or cost; it was not made."""


class UntrustedProgram(ConductorError):
    """A saved program wants to import code or reach endpoints the library didn't ship, and the caller didn't trust
    it (``trust_code=True``, ``--trust-code``). The message lists what it wants; nothing of it ran."""


class MissingDependency(ConductorError, ImportError):
    """An optional dependency is needed for this feature; the message says what to install."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the choice nearest a misspelled ``name``; ``""`` when none is near."""
    near = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def validation_problems(
    error: pydantic.ValidationError, whole: str = "(config)", model: type[pydantic.BaseModel] | None = None
) -> list[str]:
    """One ``"where: what"`` line per problem pydantic found; ``whole`` names the place of a problem with no path.
    Given the ``model`` that was validated, a misspelled key gets the nearest field name as a suggestion."""
    lines = []
    for problem in error.errors():
        where, message = problem["loc"], problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden" and model is not None:
            message += did_you_mean(str(where[-1]), _field_names(model, where[:-1]))
        lines.append(f"{'.'.join(map(str, where)) or whole}: {message}")
    return lines


def invalid_config(
    heading: str,
    error: pydantic.ValidationError,
    whole: str = "(config)",
    model: type[pydantic.BaseModel] | None = None,
) -> ConfigError:
    """A ``ConfigError`` listing every problem of ``error`` (``model``'s, if given) under ``heading``, one indented
    line each."""
    lines = validation_problems(error, whole, model)
    return ConfigError(f"{heading}:\n" + "\n".join(f"  {line}" for line in lines))


def _field_names(model: type[pydantic.BaseModel], where: tuple[int | str, ...]) -> list[str]:
    """The field names of the models that ``where`` (a validation error's path) leads to inside ``model``."""
    found: list[Any] = [model]
    for part in where:
        found = [inner for annotation in found for inner in _step(annotation, part)]
    return [name for annotation in found if _is_model(annotation) for name in annotation.model_fields]


def _step(annotation: Any, part: int | str) -> list[Any]:
    """The types one part of an error's path leads to from ``annotation``: a union member's tag (its class name), a
    model's field, a list's index or a mapping's key."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if getattr(annotation, "__name__", None) == part:
        return [annotation]
    if _is_model(annotation):
        field = annotation.model_fields.get(part) if isinstance(part, str) else None
        return _members(field.annotation) if field is not None else []
    if isinstance(part, int) and origin in (list, tuple, set, frozenset) and args:
        return _members(args[0])
    if isinstance(part, str) and origin is dict and len(args) == 2:
        return _members(args[1])
    return []


def _members(annotation: Any) -> list[Any]:
    """The types a value of ``annotation`` may have: a union's members, an ``Annotated`` type's own type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _members(args[0])
    if origin in (typing.Union, types.UnionType):
        return [member for arg in args for member in _members(arg)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)
