"""One exception family for the whole library, so callers can catch ``ConductorError``."""

from __future__ import annotations

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


def validation_problems(error: pydantic.ValidationError, whole: str = "(config)") -> list[str]:
    """One ``"where: what"`` line per problem pydantic found; ``whole`` names the place of a problem with no path."""
    return [
        f"{'.'.join(map(str, e['loc'])) or whole}: {e['msg'].removeprefix('Value error, ')}" for e in error.errors()
    ]


def invalid_config(heading: str, error: pydantic.ValidationError, whole: str = "(config)") -> ConfigError:
    """A ``ConfigError`` listing every problem of ``error`` under ``heading``, one indented line each."""
    return ConfigError(f"{heading}:\n" + "\n".join(f"  {line}" for line in validation_problems(error, whole)))
