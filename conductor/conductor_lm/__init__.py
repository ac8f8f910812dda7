"""The trainable conductor policy: a small causal LM with LoRA, built on the local generation stack
(``conductor.local``), that samples workflows, scores them for GRPO, and serves itself to DSPy as a ``dspy.LM``.

Needs torch, transformers and peft (``pip install 'dspy-conductor[local]'``); the core ``conductor`` package never
imports this one, so it works without them.
"""

import importlib.util

from conductor.errors import MissingDependency

_missing = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]
if _missing:
    raise MissingDependency(f"conductor.conductor_lm needs {', '.join(_missing)}: pip install 'dspy-conductor[local]'")

from conductor.conductor_lm._checkpoint import CONFIG_NAME  # noqa: E402
from conductor.conductor_lm._grammar import (  # noqa: E402
    WorkflowConstraint,
    WorkflowFormat,
    constrain_for,
    constrain_program,
    constraint_factory,
    round_format,
    workflow_grammar,
)
from conductor.conductor_lm._model import ConductorLM, LoraSpec  # noqa: E402
from conductor.conductor_lm._tokenizer import byte_tokenizer  # noqa: E402
from conductor.local import LogitsProcessorLike, Prompt, Sample  # noqa: E402

__all__ = [
    "CONFIG_NAME",
    "ConductorLM",
    "LogitsProcessorLike",
    "LoraSpec",
    "Prompt",
    "Sample",
    "WorkflowConstraint",
    "WorkflowFormat",
    "byte_tokenizer",
    "constrain_for",
    "constrain_program",
    "constraint_factory",
    "round_format",
    "workflow_grammar",
]
