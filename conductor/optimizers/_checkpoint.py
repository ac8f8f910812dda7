"""Checkpoints of a training run (GRPO, the warm start): everything needed to continue it exactly where it stopped,
written atomically.

Layout, one folder per checkpoint (``output_dir/checkpoints/step-00000012``)::

    checkpoint.json    format version, step, the run's fingerprint (its config, and whatever else must match to
                       continue it), the SHA-256 of trainer.pt
    trainer.pt         trainable weights by name, optimizer and scheduler state, RNG states (python, numpy, torch),
                       the per-step metrics so far
    policy/            ``ConductorLM.save``: the adapter, loadable on its own with ``ConductorLM.load``

A folder is written under a hidden temporary name and renamed into place (``write_folder_atomically``), so a run
killed at any moment leaves only complete checkpoints; a leftover temporary folder is removed by the next save. A
checkpoint that was damaged afterwards (a truncated or edited file) is refused with a ``ConductorError`` that says
which file and what to do, never loaded half-way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from conductor._files import write_folder_atomically
from conductor.conductor_lm import ConductorLM
from conductor.errors import ConductorError

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
MANIFEST = "checkpoint.json"
STATE = "trainer.pt"
POLICY = "policy"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d{8})$")


@dataclass
class Checkpoint:
    """What a restored checkpoint tells the trainer: where to go on from, and the history so far."""

    folder: Path
    step: int
    metrics: list[dict[str, Any]]
    fingerprint: dict[str, Any]


def checkpoints(output_dir: Path) -> list[Path]:
    """The complete checkpoint folders under ``output_dir``, oldest first."""
    root = output_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def no_save_bars() -> Iterator[None]:
    """transformers draws a progress bar for each save; under the trainer's own bar it is noise."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def write_checkpoint(
    output_dir: Path,
    step: int,
    policy: ConductorLM,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    metrics: list[dict[str, Any]],
    fingerprint: dict[str, Any],
    keep: int,
) -> Path:
    """Write the checkpoint of ``step`` and remove all but the newest ``keep``; returns its folder."""
    root = output_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".step-*.partial"):  # a save killed half-way
        shutil.rmtree(leftover, ignore_errors=True)
    state = {
        "weights": {n: p.detach().cpu() for n, p in policy.model.named_parameters() if p.requires_grad},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": _rng_state(),
        "metrics": metrics,
    }

    def write(tmp: Path) -> None:
        torch.save(state, tmp / STATE)
        saved_to = policy.saved_to
        try:
            with no_save_bars():
                policy.save(tmp / POLICY)
        finally:
            policy.saved_to = saved_to  # the temporary folder is about to be renamed
        manifest = {"format_version": FORMAT_VERSION, "step": step, "sha256": _sha256(tmp / STATE)}
        (tmp / MANIFEST).write_text(json.dumps(manifest | {"config": fingerprint}, indent=2) + "\n")

    folder = write_folder_atomically(root / f"step-{step:08d}", write, replace=True)
    for old in checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def read_checkpoint(
    folder: Path,
    policy: ConductorLM,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    require: Mapping[str, Any] | None = None,
) -> Checkpoint:
    """Restore weights, optimizer, scheduler and RNG states from ``folder``; ``ConductorError`` if it is damaged, or
    if its fingerprint differs from ``require`` on any of its keys (then before anything is restored)."""

    def corrupt(why: str) -> ConductorError:
        return ConductorError(
            f"checkpoint {folder} is corrupt: {why}. Delete this folder to resume from the checkpoint before it, "
            "or start the run again without resume"
        )

    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise corrupt(f"{MANIFEST} can't be read ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        raise corrupt(f"{MANIFEST} is not a format_version {FORMAT_VERSION} manifest")
    fingerprint = manifest.get("config", {})
    changed = sorted(key for key, value in (require or {}).items() if fingerprint.get(key) != value)
    if changed:
        raise ConductorError(
            f"checkpoint {folder} was written by a run with other {', '.join(changed)}: delete "
            f"{folder.parent} to start this run afresh"
        )
    if not (folder / STATE).is_file() or _sha256(folder / STATE) != manifest.get("sha256"):
        raise corrupt(f"{STATE} is missing or does not match its SHA-256 in {MANIFEST}")
    try:
        state = torch.load(folder / STATE, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds on a damaged file
        raise corrupt(f"{STATE} can't be loaded ({type(exc).__name__}: {exc})") from exc
    params = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    if set(params) != set(state["weights"]):
        raise ConductorError(f"checkpoint {folder} holds weights of another model or adapter than this policy's")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state["weights"][name])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    logger.info("resumed from %s (step %d)", folder, manifest["step"])
    return Checkpoint(folder, int(manifest["step"]), list(state["metrics"]), dict(fingerprint))
