"""Local models, run in-process: one generation stack for frozen workers and the trainable conductor policy.

``EMBEDDED_MODELS`` and ``frozen_model`` say where a model comes from and load it once; ``LocalModel`` encodes chat
messages (one encoding for everything) and samples with exact log-probs (the one ``generate``); ``LocalEngine`` serves
any of them to DSPy. A frozen local worker is that stack over a shared model; ``ConductorLM`` (``conductor_lm``) is
the same stack over a model of its own with a LoRA adapter.

Importing this package needs no torch; loading or running a model needs torch and transformers
(``pip install 'dspy-conductor[local]'``), and says so when they are missing. Importing it registers the ``local``
worker kind of pool configs.
"""

from conductor.local._encoding import PLAIN_STOP, Prompt, encode_prompt, request_messages
from conductor.local._engine import DEFAULT_MAX_TOKENS, LocalEngine, local_lm, trainable_policy
from conductor.local._model import LocalModel
from conductor.local._registry import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    LOAD_LOCK,
    EmbeddedModel,
    frozen_model,
    load_local_model,
    model_folder,
    model_label,
    resolve_dtype,
)
from conductor.local._sample import LogitsProcessorLike, PromptCache, Sample
from conductor.local._worker import local_worker

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "LOAD_LOCK",
    "PLAIN_STOP",
    "EmbeddedModel",
    "LocalEngine",
    "LocalModel",
    "LogitsProcessorLike",
    "Prompt",
    "PromptCache",
    "Sample",
    "encode_prompt",
    "frozen_model",
    "load_local_model",
    "local_lm",
    "local_worker",
    "model_folder",
    "model_label",
    "request_messages",
    "resolve_dtype",
    "trainable_policy",
]
