"""A compiled ``Conductor`` as one self-describing folder, and back.

Folder layout::

    manifest.json     format and library versions, the conductor LM, the program's ``ConductorConfig`` (its entries
                      at the top level) and whatever ``extra_manifest`` adds
    pool.json         the pool's config (``PoolSpec``): API keys are named by environment variable, never stored
    program.json      DSPy's own state of every predictor (instructions and demos), LMs left out
    conductor_lm/     a trainable conductor LM's own checkpoint (only for one)

No secret is ever written: API keys stay in the environment and are read again at load time. The folder is written
under a temporary name next to the target and renamed into place, so an earlier program there is replaced only once
the new one is complete. Loading doesn't trust the folder: what it may run is decided by ``_trust`` before anything
it names is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dspy
import pydantic

from conductor._files import replaceable_folder, write_folder_atomically
from conductor._imports import import_object
from conductor._version import __version__
from conductor.deploy._trust import ENDPOINT_KEYS, redact_url, review_program
from conductor.errors import ConductorError, ConfigError, validation_problems
from conductor.local import trainable_policy
from conductor.modules import Conductor, ConductorConfig, WorkerPool

logger = logging.getLogger(__name__)

FORMAT = "dspy-conductor-program"
FORMAT_VERSION = 1
MANIFEST, POOL, PROGRAM, POLICY_DIR = "manifest.json", "pool.json", "program.json", "conductor_lm"
VERSIONED = ("dspy", "litellm", "torch", "transformers", "peft")
# Name parts that mark a setting as a secret (api_key, aws_secret_access_key, extra_headers, ...): never written.
SECRET_PARTS = frozenset(
    {"key", "secret", "password", "token", "credential", "credentials", "auth", "authorization", "headers", "cookie"}
)


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
    policy = trainable_policy(lm)
    manifest = _manifest(program, lm, extra_manifest or {})

    def write(tmp: Path) -> None:
        _write_json(tmp / POOL, pool)
        with program.lms_set_aside():
            program.save(str(tmp / PROGRAM))
        if policy is not None:
            policy.save(tmp / POLICY_DIR)
        _write_json(tmp / MANIFEST, manifest)  # last: a folder with a manifest is complete

    target = write_folder_atomically(replaceable_folder(Path(path), MANIFEST, "a program"), write, replace=True)
    if policy is not None and hasattr(policy, "saved_to"):
        policy.saved_to = target / POLICY_DIR  # it was saved into the temporary folder, now renamed
    logger.info("saved the program to %s", target)
    return target


def program_digest(path: str | Path) -> str:
    """A SHA-256 of a folder's files by name and content, a saved program's manifest read without the time it was
    saved: the same program saved again, copied or checked out keeps its digest; one retrained or set up otherwise
    gets another."""
    folder = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        content = file.read_bytes()
        if file == folder / MANIFEST:
            with contextlib.suppress(ValueError):  # not JSON: its bytes as they are
                manifest = json.loads(content)
                if isinstance(manifest, dict):
                    manifest.pop("created", None)
                    content = json.dumps(manifest, sort_keys=True).encode()
        digest.update(f"{file.relative_to(folder).as_posix()}\0{len(content)}\0".encode() + content)
    return digest.hexdigest()


def _manifest(program: Conductor, lm: dspy.BaseLM, extra: dict[str, Any]) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"dspy-conductor": __version__, "python": platform.python_version(), **_versions()},
        "conductor_lm": _describe_lm(lm),
        **program.config().model_dump(mode="json"),
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
    config = spec.model_copy(update={"show_descriptions": pool.show_descriptions}).model_dump(mode="json")
    for worker in config["workers"]:  # keys are named by environment variable already; a URL may still carry one
        worker.update({k: redact_url(worker[k]) for k in ENDPOINT_KEYS if worker.get(k)})
    return config


def _describe_lm(lm: dspy.BaseLM) -> dict[str, Any]:
    """How to rebuild the conductor LM: a trainable policy's folder and LM options, or DSPy's own LM state."""
    policy = trainable_policy(lm)
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
    """``value`` without settings whose names mark a secret, and endpoint URLs without the credentials they carry."""
    if isinstance(value, dict):
        return {
            k: redact_url(v) if k in ENDPOINT_KEYS and v else _without_secrets(v)
            for k, v in value.items()
            if not SECRET_PARTS & set(str(k).lower().split("_"))
        }
    if isinstance(value, list | tuple):
        return [_without_secrets(v) for v in value]
    return value


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# ---- load ------------------------------------------------------------------------------------------------------
def load_program(path: str | Path, *, trust_code: bool = False) -> Conductor:
    """Rebuild the program saved in the folder ``path``. API keys are read from the environment now.

    Untrusted (the default), a program that names code the library didn't ship or an endpoint of its own is refused
    with the list of what it wants, before anything it names is imported (see ``_trust``); ``trust_code=True`` lets
    it run, for programs whose author you trust."""
    folder, manifest, pool_config = _reviewed(path, trust_code)
    versions = manifest.get("versions")
    _warn_on_version_change(versions if isinstance(versions, dict) else {})
    _require(folder / PROGRAM)
    config = _read_config(folder / MANIFEST, manifest)
    lm = _load_lm(_lm_description(folder / MANIFEST, manifest), folder)
    program = Conductor.from_config(config, WorkerPool.from_config(pool_config), lm)
    try:
        with program.lms_set_aside():
            program.load(str(folder / PROGRAM))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # what DSPy raises on a bad state
        program.pool.close()
        raise ConductorError(f"{folder / PROGRAM} can't be loaded: {type(exc).__name__}: {exc}") from exc
    unreadable = [name for name, p in program.named_predictors() if not _are_demos(p.demos)]
    if unreadable:  # DSPy keeps whatever the file holds: it would fail only when the program runs
        program.pool.close()
        raise ConductorError(f"{folder / PROGRAM} can't be loaded: the demos of {unreadable} are not objects")
    if manifest["conductor_lm"].get("workflow_grammar"):
        from conductor.conductor_lm import constrain_program

        constrain_program(program)  # decode under the grammar it was saved with, rebuilt for this pool
    logger.info("loaded the program from %s", folder)
    return program


def load_program_pool(path: str | Path, *, trust_code: bool = False) -> WorkerPool:
    """The worker pool of the program saved in the folder ``path``, without loading its conductor LM (what
    ``conductor pool --program`` lists); refused as ``load_program`` refuses an untrusted program."""
    _, _, pool_config = _reviewed(path, trust_code)
    return WorkerPool.from_config(pool_config)


def _reviewed(path: str | Path, trust_code: bool) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The program folder, its manifest and its pool config, once ``_trust`` has allowed what they name."""
    folder = Path(path).expanduser().absolute()
    if not folder.is_dir():
        raise ConductorError(f"{folder} is not a folder: there is no saved program there")
    manifest = _read_json(folder / MANIFEST)
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ConductorError(
            f"{folder / MANIFEST} is format {manifest.get('format')!r} version {manifest.get('format_version')!r}; "
            f"this library reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    pool_config = _read_json(folder / POOL)
    review_program(manifest, pool_config).enforce(str(folder), trust_code=trust_code)
    return folder, manifest, pool_config


def _read_config(path: Path, manifest: dict[str, Any]) -> ConductorConfig:
    """The program's options: the manifest's entries that are ``ConductorConfig`` fields (an older manifest may lack
    some; they take their defaults)."""
    try:
        return ConductorConfig.model_validate({k: v for k, v in manifest.items() if k in ConductorConfig.model_fields})
    except pydantic.ValidationError as exc:
        raise ConductorError(f"{path} holds invalid program options: {'; '.join(validation_problems(exc))}") from None


def _are_demos(demos: Any) -> bool:
    return isinstance(demos, list) and all(isinstance(demo, dict | dspy.Example) for demo in demos)


def _lm_description(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``conductor_lm`` entry, after checking it has the fields ``_load_lm`` reads."""
    description = manifest.get("conductor_lm")
    needs = {"policy": {"folder": str, "class": str, "lm_kwargs": dict}, "dspy_lm": {"model": str, "state": dict}}
    fields = needs.get(description.get("kind")) if isinstance(description, dict) else None
    if fields is None:
        raise ConductorError(f"{path}: conductor_lm must be an object whose kind is 'policy' or 'dspy_lm'")
    wrong = [name for name, kind in fields.items() if not isinstance(description.get(name), kind)]
    if wrong:
        kinds = ", ".join(f"{name} ({fields[name].__name__})" for name in wrong)
        raise ConductorError(f"{path}: conductor_lm of kind {description['kind']!r} lacks {kinds}")
    return description


def _warn_on_version_change(saved: dict[str, str]) -> None:
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


def _import_path(obj: type) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _require(path: Path) -> Path:
    if not path.exists():
        folder = path.parent
        inside = [f"{folder / name}" for name in ("best", "program") if (folder / name / path.name).exists()]
        if inside:  # a compile's or a train's output folder: the program is one level down
            raise ConductorError(f"{folder} is a run's output folder, not a saved program; load {inside[0]}")
        raise ConductorError(f"{path} is missing: the saved program is incomplete")
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_require(path).read_text())
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise ConductorError(f"{path} can't be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConductorError(f"{path} must hold a JSON object")
    return data
