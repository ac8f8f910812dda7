"""Saving and loading a ``ConductorLM``: adapter, tokenizer and ``conductor_lm.json``, written atomically.

Folder layout::

    conductor_lm.json                    name, base (embedded name or folder), dtype, LoRA spec, what is stored
    adapter_config.json                  peft's adapter (with LoRA), or config.json + model.safetensors without
    adapter_model.safetensors
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    base/                                the base weights, only when they can't be reloaded from ``base``

The folder is written under a temporary name next to the target and renamed into place, so a crash never leaves a
half-written checkpoint, and an earlier checkpoint in the same place is replaced only once the new one is complete.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conductor._files import replaceable_folder, write_folder_atomically
from conductor.conductor_lm._base import load_base, quiet_peft
from conductor.errors import ConductorError
from conductor.local import EMBEDDED_MODELS, LOAD_LOCK, resolve_dtype

logger = logging.getLogger(__name__)

CONFIG_NAME = "conductor_lm.json"
ADAPTER_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
BASE_DIR = "base"
FORMAT_VERSION = 1


class Policy(Protocol):
    """What ``save_policy`` reads from a policy and ``load_policy`` sets on the one it builds: a ``ConductorLM``.
    Named by what is used rather than by the class, whose ``save`` and ``load`` call this module, so that this module
    needs no import of it."""

    name: str
    model: Any
    tokenizer: Any
    lora: Any
    base: str | None
    saved_to: Path | None

    def base_model(self) -> Any: ...

    def config(self) -> dict[str, Any]: ...


P = TypeVar("P", bound=Policy)


def save_policy(policy: Policy, folder: Path) -> Path:
    """Write ``policy`` to ``folder`` (see the module docstring); returns the absolute folder."""
    started = time.perf_counter()
    config: dict[str, Any] = {"format_version": FORMAT_VERSION, **policy.config()}
    config["weights"] = "adapter" if policy.lora is not None else "full"
    config["base_weights"] = BASE_DIR if policy.lora is not None and policy.base is None else None

    def write(tmp: Path) -> None:
        if policy.lora is not None:  # a PeftModel writes only its adapter
            _name_base_by_hub_id(policy)
            # The vocabulary is never resized here; peft's "auto" would ask the hub for the base's config to check.
            policy.model.save_pretrained(tmp, save_embedding_layers=False)
        else:
            policy.model.save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)
        if config["base_weights"]:
            policy.base_model().save_pretrained(tmp / BASE_DIR)
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    saved = write_folder_atomically(replaceable_folder(folder, CONFIG_NAME, "a ConductorLM"), write, replace=True)
    logger.info("saved %s to %s in %.1f s", policy.name, saved, time.perf_counter() - started)
    return saved


def _name_base_by_hub_id(policy: Policy) -> None:
    """Make the adapter name an embedded base by its hub id: peft would write the cache folder the base was loaded
    from, which exists only on the machine that saved it; with the hub id the folder is a standard peft adapter
    (``AutoPeftModelForCausalLM`` loads it), and ``load_policy`` maps the id back to the embedded GGUF."""
    embedded = EMBEDDED_MODELS.get(policy.base or "")
    if embedded is not None:
        for adapter in policy.model.peft_config.values():
            adapter.base_model_name_or_path = embedded.hub_id


def _embedded_name(base: str) -> str:
    """The embedded model whose hub id ``base`` is (as a peft adapter names its base), else ``base`` itself."""
    return next((name for name, model in EMBEDDED_MODELS.items() if model.hub_id == base), base)


def read_config(folder: Path) -> dict[str, Any]:
    """``conductor_lm.json`` of a saved policy, with a clear error when it is missing or unreadable."""
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise ConductorError(f"{path} is missing: {folder} is not a folder written by ConductorLM.save")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise ConductorError(f"{path} can't be read: {exc}") from exc
    if not isinstance(config, dict):
        raise ConductorError(f"{path} must hold a JSON object")
    if config.get("format_version") != FORMAT_VERSION:
        raise ConductorError(f"{path} has format_version {config.get('format_version')!r}, expected {FORMAT_VERSION}")
    return config


def load_policy(
    cls: Callable[..., P],
    folder: Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
    sampling_dtype: str | torch.dtype | None = None,
) -> P:
    """Rebuild a policy written by ``save_policy`` as ``cls(model, tokenizer, base=..., lora=None, name=...,
    device=..., sampling_dtype=...)`` (``ConductorLM``, or a subclass); ``sampling_dtype`` as in ``ConductorLM``."""
    from peft import PeftModel

    started = time.perf_counter()
    folder = folder.expanduser().absolute()
    config = read_config(folder)
    torch_dtype = resolve_dtype(dtype or config["dtype"])
    base = config["base"] and _embedded_name(config["base"])
    if config["weights"] != "full":
        for name in (ADAPTER_CONFIG_NAME, ADAPTER_NAME):
            if not (folder / name).is_file():
                raise ConductorError(f"the LoRA adapter file {folder / name} is missing: the checkpoint is incomplete")
        base_dir = config["base_weights"] and folder / config["base_weights"]
        if base_dir and not (base_dir / "config.json").is_file():
            raise ConductorError(f"the base model folder {base_dir} is missing: the checkpoint is incomplete")
    with LOAD_LOCK:  # transformers loads one model at a time safely
        if config["weights"] == "full":
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
        else:
            if base_dir:
                model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch_dtype)
            else:
                _, model, _ = load_base(base, torch_dtype)
            with quiet_peft():
                model = PeftModel.from_pretrained(model, folder, is_trainable=True)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = cls(
        model,
        tokenizer,
        base=base,
        lora=None,
        name=config["name"],
        device=device,
        sampling_dtype=sampling_dtype,
    )
    policy.saved_to = folder
    logger.info("loaded %s from %s in %.1f s", policy.name, folder, time.perf_counter() - started)
    return policy
