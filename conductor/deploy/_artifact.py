"""A compiled ``Conductor`` as one self-describing folder, and back.

Folder layout::

    manifest.json     format and library versions, the conductor LM, the task signature, max steps and depth, budget,
                      roles (import paths of built-ins, instructions of all) and whatever ``extra_manifest`` adds
    pool.json         the pool's config (``PoolSpec``): API keys are named by environment variable, never stored
    program.json      DSPy's own state of every predictor (instructions and demos), LMs left out
    conductor_lm/     a trainable conductor LM's own checkpoint (only for one)

No secret is ever written: API keys stay in the environment and are read again at load time. The folder is written
under a temporary name next to the target and renamed into place, so an earlier program there is replaced only once
the new one is complete. Loading trusts the folder: the pool and the conductor LM may name classes and functions to
import, as a pool config does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import json
import logging
import platform
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dspy

from conductor._files import write_folder_atomically
from conductor._imports import import_object
from conductor.errors import ConductorError, ConfigError
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.signatures import BUILTIN_ROLES, role_name

logger = logging.getLogger(__name__)

FORMAT = "dspy-conductor-program"
FORMAT_VERSION = 1
MANIFEST, POOL, PROGRAM, POLICY_DIR = "manifest.json", "pool.json", "program.json", "conductor_lm"
VERSIONED = ("dspy", "litellm", "torch", "transformers", "peft")
# Name parts that mark a setting as a secret (api_key, aws_secret_access_key, extra_headers, ...): never written.
SECRET_PARTS = frozenset(
    {"key", "secret", "password", "token", "credential", "credentials", "auth", "authorization", "headers", "cookie"}
)
_BUILTINS = {role_name(role): role for role in BUILTIN_ROLES}


# ---- save ------------------------------------------------------------------------------------------------------
def save_program(program: Conductor, path: str | Path, *, extra_manifest: dict[str, Any] | None = None) -> Path:
    """Write ``program`` to the folder ``path`` (see the module docstring); returns the absolute folder.

    The conductor LM saved is the program's own, else ``dspy.settings.lm`` (the loaded program then keeps it).

    ``extra_manifest`` adds top-level manifest entries (e.g. the chosen Pareto point of a compile run); it may not
    replace the library's own. The program's predictors briefly lose their LMs while DSPy writes ``program.json``,
    so don't call the program from another thread during a save.
    """
    lm = program.orchestrate.lm or dspy.settings.lm
    if lm is None:
        raise ConfigError("the program has no conductor LM (and dspy.settings.lm is unset): nothing to save it with")
    pool = _pool_spec(program.pool)
    policy = _policy(lm)
    manifest = _manifest(program, lm, extra_manifest or {})

    def write(tmp: Path) -> None:
        _write_json(tmp / POOL, pool)
        with _lms_set_aside(program):
            program.save(str(tmp / PROGRAM))
        if policy is not None:
            policy.save(tmp / POLICY_DIR)
        _write_json(tmp / MANIFEST, manifest)  # last: a folder with a manifest is complete

    target = write_folder_atomically(_check_target(Path(path)), write, replace=True)
    if policy is not None and hasattr(policy, "saved_to"):
        policy.saved_to = target / POLICY_DIR  # it was saved into the temporary folder, now renamed
    logger.info("saved the program to %s", target)
    return target


def _check_target(target: Path) -> Path:
    """The absolute ``target``, after refusing a file or a non-empty folder that is not a saved program (saving
    replaces the folder: a wrong path must not delete data)."""
    target = target.expanduser().absolute()
    if target.exists():
        if not target.is_dir():
            raise ConductorError(f"{target} is a file, not a folder to save a program in")
        if any(target.iterdir()) and not (target / MANIFEST).is_file():
            raise ConductorError(f"{target} is not empty and holds no {MANIFEST}: refusing to overwrite it")
    return target


def _manifest(program: Conductor, lm: dspy.BaseLM, extra: dict[str, Any]) -> dict[str, Any]:
    from conductor import __version__

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"dspy-conductor": __version__, "python": platform.python_version(), **_versions()},
        "conductor_lm": _describe_lm(lm),
        "signature": _signature_text(program.signature),
        "max_steps": program.limits.max_steps,
        "max_depth": program.max_depth,
        "budget": dataclasses.asdict(program.executor.budget),
        "fallback": program.fallback,
        "max_question_chars": program.max_question_chars,
        "max_parallel": program.executor.max_parallel,
        "roles": [_describe_role(name, predictor) for name, predictor in program.roles.items()],
    }
    clashes = sorted(set(extra) & set(manifest))
    if clashes:
        raise ConfigError(f"extra_manifest may not replace the manifest's own entries: {clashes}")
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"extra_manifest must be JSON-serializable: {exc}") from exc
    return manifest | extra


def _versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def _pool_spec(pool: WorkerPool) -> dict[str, Any]:
    spec = pool.spec
    if spec is None:
        raise ConfigError(
            "the pool was built in code and has no config to save: build it with WorkerPool.from_config or "
            "WorkerPool.from_file to save the program"
        )
    if [w.name for w in spec.workers] != pool.names:
        raise ConfigError(f"the pool's workers {pool.names} no longer match its config; build it from config again")
    return spec.model_copy(update={"show_descriptions": pool.show_descriptions}).model_dump(mode="json")


def _policy(lm: dspy.BaseLM) -> Any:
    """The trainable model behind ``lm`` (``ConductorLM.as_dspy_lm()`` serves ``engine.policy``), if it saves itself."""
    policy = getattr(getattr(lm, "engine", None), "policy", None)
    return policy if callable(getattr(policy, "save", None)) else None


def _describe_lm(lm: dspy.BaseLM) -> dict[str, Any]:
    """How to rebuild the conductor LM: a trainable policy's folder and LM options, or DSPy's own LM state."""
    policy = _policy(lm)
    if policy is not None:
        from conductor.conductor_lm import WorkflowConstraint

        options = {**lm.kwargs, "cache": lm.cache, "num_retries": lm.num_retries}
        return {
            "kind": "policy",
            "model": lm.model,
            "folder": f"{POLICY_DIR}/",
            "class": _import_path(type(policy)),
            "lm_kwargs": _without_secrets(options),
            "workflow_grammar": isinstance(lm.engine.logits_processor, WorkflowConstraint),
        }
    try:
        state = lm.dump_state()
    except (TypeError, ValueError, ConductorError) as exc:
        raise ConfigError(f"the conductor LM {lm.model!r} can't be saved: {exc}") from exc
    return {"kind": "dspy_lm", "model": lm.model, "state": _without_secrets(state)}


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items() if not SECRET_PARTS & set(str(k).lower().split("_"))}
    if isinstance(value, list | tuple):
        return [_without_secrets(v) for v in value]
    return value


def _describe_role(name: str, predictor: dspy.Predict) -> dict[str, Any]:
    signature = predictor.signature
    builtin = _BUILTINS.get(name)
    same_fields = builtin is not None and list(builtin.fields) == list(signature.fields)
    return {
        "name": name,
        "class": _import_path(builtin) if same_fields else None,  # None: rebuilt from `signature`
        "signature": _signature_text(signature),
        "instructions": signature.instructions,
    }


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


@contextlib.contextmanager
def _lms_set_aside(program: Conductor) -> Iterator[None]:
    """Predictors without LMs while DSPy saves or loads their state: the conductor LM is saved on its own."""
    lms = [(predictor, predictor.lm) for _, predictor in program.named_predictors()]
    for predictor, _ in lms:
        predictor.lm = None
    try:
        yield
    finally:
        for predictor, lm in lms:
            predictor.lm = lm


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# ---- load ------------------------------------------------------------------------------------------------------
def load_program(path: str | Path) -> Conductor:
    """Rebuild the program saved in the folder ``path``. API keys are read from the environment now."""
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir():
        raise ConductorError(f"{folder} is not a folder: there is no saved program there")
    manifest = _read_json(folder / MANIFEST)
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ConductorError(
            f"{folder / MANIFEST} is format {manifest.get('format')!r} version {manifest.get('format_version')!r}; "
            f"this library reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    _warn_on_version_change(manifest.get("versions", {}))
    pool_config = _read_json(folder / POOL)
    _require(folder / PROGRAM)
    lm = _load_lm(manifest["conductor_lm"], folder)
    program = Conductor(
        WorkerPool.from_config(pool_config),
        lm,
        signature=manifest["signature"],
        max_steps=manifest["max_steps"],
        max_depth=manifest.get("max_depth", 0),
        roles=[_load_role(role) for role in manifest["roles"]],
        budget=Budget(**manifest["budget"]),
        fallback=manifest["fallback"],
        max_question_chars=manifest["max_question_chars"],
        max_parallel=manifest.get("max_parallel", 4),
    )
    try:
        with _lms_set_aside(program):
            program.load(str(folder / PROGRAM))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        program.pool.close()
        raise ConductorError(f"{folder / PROGRAM} can't be loaded: {type(exc).__name__}: {exc}") from exc
    if manifest["conductor_lm"].get("workflow_grammar"):
        from conductor.conductor_lm import constrain_program

        constrain_program(program)  # decode under the grammar it was saved with, rebuilt for this pool
    logger.info("loaded the program from %s", folder)
    return program


def _warn_on_version_change(saved: dict[str, str]) -> None:
    from conductor import __version__

    if saved.get("dspy-conductor") != __version__:
        logger.warning(
            "this program was saved by dspy-conductor %s; this is %s", saved.get("dspy-conductor"), __version__
        )


def _load_lm(description: dict[str, Any], folder: Path) -> dspy.BaseLM:
    if description["kind"] == "policy":
        policy_dir = _require(folder / description["folder"])
        policy_class = import_object(description["class"])
        try:
            policy = policy_class.load(policy_dir)
        except ConductorError:
            raise
        except Exception as exc:
            raise ConductorError(f"can't load the conductor LM from {policy_dir}: {type(exc).__name__}: {exc}") from exc
        return policy.as_dspy_lm(**description["lm_kwargs"])
    try:
        return dspy.LM.load_state(description["state"], allow_custom_lm_class=True)
    except (ImportError, TypeError, ValueError) as exc:
        raise ConductorError(f"can't rebuild the conductor LM {description['model']!r}: {exc}") from exc


def _load_role(entry: dict[str, Any]) -> type[dspy.Signature]:
    if entry["class"]:
        role = import_object(entry["class"])
        if not (isinstance(role, type) and issubclass(role, dspy.Signature)):
            raise ConductorError(f"role {entry['name']!r}: {entry['class']} is not a dspy.Signature")
        return role
    return dspy.make_signature(entry["signature"], entry["instructions"], signature_name=entry["name"])


def _import_path(obj: type) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _require(path: Path) -> Path:
    if not path.exists():
        raise ConductorError(f"{path} is missing: the saved program is incomplete")
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_require(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConductorError(f"{path} can't be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConductorError(f"{path} must hold a JSON object")
    return data
