"""One way to name a conductor LM, wherever one is named: ``conductor run --conductor``, a run config's
``program.conductor`` and an experiment method's ``lm``.

- ``tiny``: a random-weight trainable model (``ConductorLM.tiny``), for tests;
- ``local/<name>``: an embedded local model (``conductor.local.EMBEDDED_MODELS``), trainable;
- a path: a folder saved by ``ConductorLM.save`` (it holds ``conductor_lm.json``), or a transformers model folder or
  ``.gguf`` file, trainable;
- anything else: a litellm model string (any provider): prompt search and budgets, but no GRPO.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import dspy

from conductor.errors import ConfigError

if TYPE_CHECKING:
    from conductor.conductor_lm import ConductorLM, LoraSpec

TINY = "tiny"
LOCAL = "local/"


def is_trainable(name: str) -> bool:
    """Whether ``name`` names a model whose weights GRPO can train (not a litellm model string)."""
    return name == TINY or name.startswith(LOCAL) or Path(name).expanduser().exists()


def conductor_policy(name: str, lora: LoraSpec | None = None) -> ConductorLM:
    """The trainable model ``name`` names; ``lora`` is the adapter a new one gets (a saved one keeps its own)."""
    if not is_trainable(name):
        raise ConfigError(f"{name!r} is not a trainable model: name {TINY}, {LOCAL}<name> or a model folder")
    from conductor.conductor_lm import CONFIG_NAME, ConductorLM  # torch and peft, only for these

    if name == TINY:
        return ConductorLM.tiny(lora=lora)
    path = Path(name).expanduser()
    if (path / CONFIG_NAME).is_file():
        return ConductorLM.load(path)
    return ConductorLM.from_pretrained(name.removeprefix(LOCAL) if name.startswith(LOCAL) else path, lora=lora)


def conductor_lm(name: str, *, max_tokens: int, temperature: float = 0.0, lora: LoraSpec | None = None) -> dspy.BaseLM:
    """The ``dspy`` LM of the conductor ``name`` names: a trainable model served to DSPy, or a litellm model."""
    if not is_trainable(name):
        return dspy.LM(name, max_tokens=max_tokens, temperature=temperature, cache=False)
    return conductor_policy(name, lora).as_dspy_lm(max_tokens=max_tokens, temperature=temperature)
