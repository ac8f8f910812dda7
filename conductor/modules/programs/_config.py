"""``ConductorConfig``: every option of a ``Conductor`` besides its pool and LM, listed once.

The constructor reads its options through it, ``Conductor.config()`` gives a program's current options back, and
``Conductor.from_config`` rebuilds a program from one, so saving and loading (``conductor.deploy``) never name a field.
In JSON the task signature is text (``"question: str -> answer: str"``) and each role names its built-in class, or
carries its signature and instructions; a saved program's manifest holds these entries at its top level.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import dspy
import pydantic

from conductor._imports import import_object
from conductor.errors import ConfigError
from conductor.modules.run import Budget
from conductor.signatures import BUILTIN_ROLES, role_name

Fallback = Literal["first_worker", "none"]
WorkerIds = Literal["numbers", "names"]
_BUILTINS = {role_name(role): role for role in BUILTIN_ROLES}


def named_role(name: str, signature: type[dspy.Signature]) -> type[dspy.Signature]:
    """``signature`` as the role ``name``: the built-in class when it equals it (fields and instructions), itself
    when it has that name, else a copy named ``name`` (DSPy renames a signature whose instructions were changed)."""
    builtin = _BUILTINS.get(name)
    if builtin is not None and builtin.equals(signature):
        return builtin
    if role_name(signature) == name:
        return signature
    return dspy.make_signature(dict(signature.fields), signature.instructions, signature_name=name)


def _builtin_path(role: type[dspy.Signature]) -> str | None:
    """The import path of the built-in role with ``role``'s name and fields (instructions may differ: a saved program
    loads them from its DSPy state), if there is one."""
    builtin = _BUILTINS.get(role_name(role))
    if builtin is None or list(builtin.fields) != list(role.fields):
        return None
    return f"{builtin.__module__}:{builtin.__qualname__}"


# ---- JSON form of signatures and roles ----------------------------------------------------------------------------
def _signature_text(signature: type[dspy.Signature]) -> str:
    """``"question: str -> answer: int"``; refused when DSPy would not read the same fields and types back."""

    def side(fields: dict[str, Any]) -> str:
        return ", ".join(f"{name}: {_type_text(field.annotation)}" for name, field in fields.items())

    text = f"{side(signature.input_fields)} -> {side(signature.output_fields)}"
    try:
        parsed = dspy.ensure_signature(text)
    except (ValueError, TypeError, SyntaxError, NameError) as exc:
        raise ConfigError(f"the signature {signature.signature!r} can't be saved as text ({text!r}): {exc}") from exc
    types = {name: field.annotation for name, field in signature.fields.items()}
    if {name: field.annotation for name, field in parsed.fields.items()} != types:
        raise ConfigError(f"the signature {signature.signature!r} can't be saved as text: its field types {types}")
    return text


def _type_text(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else repr(annotation).replace("typing.", "")


def _role_entry(role: type[dspy.Signature]) -> dict[str, Any]:
    return {
        "name": role_name(role),
        "class": _builtin_path(role),  # None: rebuilt from `signature` and `instructions`
        "signature": _signature_text(role),
        "instructions": role.instructions,
    }


def _role(value: Any) -> Any:
    """A role from its JSON entry (a built-in's import path, or a signature and instructions); a class as it is."""
    if not isinstance(value, dict):
        return value
    if value.get("class"):
        role = import_object(value["class"], "role ")
        if not (isinstance(role, type) and issubclass(role, dspy.Signature)):
            raise ValueError(f"role {value.get('name')!r}: {value['class']} is not a dspy.Signature")
        return role
    return dspy.make_signature(value["signature"], value["instructions"], signature_name=value["name"])


def _roles(value: Any) -> Any:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return value  # pydantic reports it
    return tuple(_role(role) for role in value)  # PoolProgram checks that the executor can use them


Signature = Annotated[
    type[dspy.Signature],
    pydantic.BeforeValidator(lambda value: dspy.ensure_signature(value) if isinstance(value, str) else value),
    pydantic.PlainSerializer(_signature_text, when_used="json"),
]
Roles = Annotated[
    tuple[type[dspy.Signature], ...],
    pydantic.BeforeValidator(_roles),
    pydantic.PlainSerializer(lambda roles: [_role_entry(role) for role in roles], when_used="json"),
    pydantic.Field(min_length=1),
]


class ConductorConfig(pydantic.BaseModel):
    """A ``Conductor``'s options (see its docstring); ``model_dump(mode="json")`` is what a saved program keeps.

    Attributes:
        signature: the user's task signature (a class or ``"question -> answer"`` text).
        max_steps: the most steps a workflow may have (the paper used 5).
        max_depth: the most recursive rounds a run may add (0: the conductor can't choose itself).
        fallback: on an unusable workflow, ``"first_worker"`` asks worker 0 the question directly (recorded as a
            format error all the same); ``"none"`` returns no answer.
        worker_ids: how the conductor names workers in its workflows: ``"numbers"`` (``Model 2``, the paper's form)
            or ``"names"`` (the pool's names, ``model_id = ["gemma", "check"]``). A conductor trained on numbers
            learns places, and a pool in another order or without a worker changes what they mean; names keep it.
        roles: role signatures a step may take; the first is the default role.
        budget: per-run limits on steps, tokens and cost.
        max_parallel: the most steps that run at once.
        max_question_chars: longer questions are refused before any model is called.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    signature: Signature = dspy.ensure_signature("question -> answer")
    max_steps: int = pydantic.Field(5, ge=1)
    max_depth: int = 0  # checked by Conductor.max_depth
    fallback: Fallback = "first_worker"
    worker_ids: WorkerIds = "numbers"
    roles: Roles = BUILTIN_ROLES
    budget: Budget = Budget()
    max_parallel: int = 4  # checked by the Executor
    max_question_chars: int = pydantic.Field(200_000, ge=1)
