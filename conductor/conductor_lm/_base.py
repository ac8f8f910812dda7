"""The base model under a policy: a fresh, private copy loaded through the local registry, and the quiet way to wrap
it in peft's LoRA layers.

Both ``ConductorLM`` (``_model.py``: building a policy) and its checkpoints (``_checkpoint.py``: rebuilding one) need
these; they live here, below both, so that neither of those two files imports the other.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conductor.local import LOAD_LOCK, model_folder


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Hide the FutureWarning peft 0.21 triggers in transformers 5 (``is_gradient_checkpointing``) on every wrap."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_base(source: str | os.PathLike[str], dtype: torch.dtype) -> tuple[str, Any, Any]:
    """``(source, model, tokenizer)``: a fresh, private copy of a local model or transformers folder (from the
    registry and GGUF cache of ``conductor.local``, but not its frozen models: peft injects LoRA layers into the
    model in place, and training changes weights that local workers share)."""
    with LOAD_LOCK:  # transformers loads one model at a time safely
        source, folder = model_folder(source)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return source, model, tokenizer
