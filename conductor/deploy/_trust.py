"""What a saved program would make this process do beyond the library's own code, read from its files before anything
in it is imported or built.

A program folder may come from anyone, and ``conductor serve`` runs it for people nobody vetted. Untrusted (the
default), a program may use only what the library ships: its built-in tools and roles, its conductor LM class and
local engine, code run in the sandbox, and API models at their provider's default endpoint. Anything else needs the
caller's explicit trust (``trust_code=True``, ``--trust-code``; the spirit of transformers' ``trust_remote_code``):
a tool, role, LM or engine class named by import path, code run without the sandbox, or an API model sent to an
``api_base`` of the program's choosing (litellm would hand it the provider key from the environment). The
environment variables a program reads are logged when it loads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dspy.clients.base_lm import LM_CLASS_STATE_KEY

from conductor.errors import UntrustedProgram
from conductor.modules import BUILTIN_TOOLS
from conductor.signatures import BUILTIN_ROLES

logger = logging.getLogger(__name__)

DSPY_LM_CLASS = "dspy.clients.lm.LM"
ENDPOINT_KEYS = ("api_base", "base_url")
"""Settings that send an API model's requests, and with them the provider key litellm finds, somewhere else."""


def import_path(obj: type) -> str:
    """``module:qualname``, the form saved programs and configs name classes by."""
    return f"{obj.__module__}:{obj.__qualname__}"


def shipped_classes() -> frozenset[str]:
    """Import paths of the classes an untrusted program may name: the built-in roles, the conductor policy class
    and the local model engine (in the spellings DSPy and this library write them)."""
    from conductor.conductor_lm import ConductorLM
    from conductor.local import LocalEngine

    classes = (*BUILTIN_ROLES, ConductorLM, LocalEngine)
    return frozenset(p for c in classes for p in (import_path(c), import_path(c).replace(":", ".")))


@dataclass(frozen=True)
class ProgramReview:
    """What a program asks for that only a trusted program may have, and the environment variables it reads."""

    code: tuple[str, ...] = ()
    """Code it would run that the library didn't ship or sandbox, one phrase each (``"imports os:system (...)"``)."""
    endpoints: tuple[str, ...] = ()
    """API models sent to an endpoint of the program's choosing, as ``"<what> -> <url>"``."""
    env_vars: tuple[str, ...] = ()

    @property
    def needs_trust(self) -> bool:
        return bool(self.code or self.endpoints)

    def enforce(self, source: str, *, trust_code: bool) -> None:
        """Log what ``source`` reads from the environment; refuse it, before anything runs, if it needs trust that
        wasn't given."""
        if self.env_vars:
            logger.warning("%s reads these environment variables: %s", source, ", ".join(self.env_vars))
        if not self.needs_trust:
            return
        wants = [*self.code, *(f"sends requests to {endpoint}" for endpoint in self.endpoints)]
        if not trust_code:
            raise UntrustedProgram(
                f"{source} is not trusted and wants to run code or reach endpoints the library didn't ship: "
                f"{'; '.join(wants)}. Load it with trust_code=True (CLI: --trust-code) only if you trust its author."
            )
        logger.warning("trusting %s, which %s", source, "; ".join(wants))


def review_program(manifest: Mapping[str, Any], pool_config: Mapping[str, Any]) -> ProgramReview:
    """Read what a saved program's ``manifest.json`` and ``pool.json`` ask for; imports nothing they name."""
    allowed = shipped_classes()
    code: list[str] = []
    endpoints: list[str] = []
    env_vars: list[str] = []
    for worker in _entries(pool_config.get("workers")):
        name = worker.get("name")
        tool = worker.get("tool")
        if worker.get("kind") == "tool" and tool not in BUILTIN_TOOLS:
            code.append(f"imports {tool} (tool of worker {name!r})")
        if worker.get("isolation") == "none":
            code.append(f"runs code without the sandbox (worker {name!r}, isolation: none)")
        endpoints += [f"worker {name!r} -> {redact_url(worker[k])}" for k in ENDPOINT_KEYS if worker.get(k)]
        if worker.get("api_key_env"):
            env_vars.append(str(worker["api_key_env"]))
    for role in _entries(manifest.get("roles")):
        if role.get("class") and role["class"] not in allowed:
            code.append(f"imports {role['class']} (role {role.get('name')!r})")
    lm = manifest.get("conductor_lm")
    lm = lm if isinstance(lm, Mapping) else {}
    if lm.get("kind") == "policy" and lm.get("class") not in allowed:
        code.append(f"imports {lm.get('class')} (conductor LM)")
    state = lm.get("state") if isinstance(lm.get("state"), Mapping) else {}
    lm_class = state.get(LM_CLASS_STATE_KEY)
    if lm_class is not None and lm_class != DSPY_LM_CLASS:
        code.append(f"imports {lm_class} (conductor LM class)")
    for key in ("engine", "async_engine"):
        engine = state.get(key)
        if not isinstance(engine, Mapping):
            continue
        if engine.get("class") not in allowed:
            code.append(f"imports {engine.get('class')} (conductor LM engine)")
        engine_state = engine.get("state") if isinstance(engine.get("state"), Mapping) else {}
        model_class = engine_state.get("model_class")  # the local engine reopens a saved policy by its class
        if model_class is not None and model_class not in allowed:
            code.append(f"imports {model_class} (conductor LM model)")
    endpoints += [f"the conductor LM -> {redact_url(state[k])}" for k in ENDPOINT_KEYS if state.get(k)]
    return ProgramReview(tuple(code), tuple(endpoints), tuple(dict.fromkeys(env_vars)))


def redact_url(url: Any) -> str:
    """``url`` without the credentials it may carry (``user:password@``, query string, fragment), for logs and saved
    files."""
    text = str(url)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return "<unreadable URL>"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _entries(value: Any) -> Iterable[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
