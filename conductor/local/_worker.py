"""Local workers: an ``LMWorker`` over a frozen local model, and the ``local`` worker kind of pool configs."""

from __future__ import annotations

import os
from typing import Any

from conductor.local._engine import local_lm
from conductor.local._registry import DEFAULT_MODEL, EMBEDDED_MODELS
from conductor.modules import LMWorker, register_worker_kind


def local_worker(
    model: str | os.PathLike[str] = DEFAULT_MODEL,
    name: str | None = None,
    *,
    dtype: str = "float32",
    num_threads: int | None = None,
    **worker_kwargs: Any,
) -> LMWorker:
    """An ``LMWorker`` over a local model, with exact token counts from the model's own tokenizer."""
    lm = local_lm(model, dtype=dtype, num_threads=num_threads)
    engine = lm.engine
    embedded = EMBEDDED_MODELS.get(engine.source)
    worker_kwargs.setdefault("description", embedded.description if embedded else f"local model {engine.source}")
    return LMWorker(name or lm.model.removeprefix("local/"), lm, **worker_kwargs)


register_worker_kind("local", lambda spec, options: local_worker(spec.model, name=spec.name, **options))
