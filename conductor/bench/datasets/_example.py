"""One benchmark item as a DSPy example, the same shape for every family."""

from __future__ import annotations

from typing import Any

import dspy


def make_example(question: str, answer: str, family: str, **labels: Any) -> dspy.Example:
    """An example whose input is ``question``; ``answer``, ``family`` (e.g. "mmlu", "bigbench/navigate") and any
    other ``labels`` are what the metric checks against."""
    return dspy.Example(question=question, answer=answer, family=family, **labels).with_inputs("question")
