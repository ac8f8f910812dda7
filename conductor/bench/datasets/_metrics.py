"""Answer checks shared by the benchmark metrics: exact text, numbers, and which lettered option a reply picks."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Any

import pydantic

from conductor.errors import did_you_mean
from conductor.modules import bare_answer, choice_index, extract_answer, normalise, option_labels


def answer_text(prediction: Any) -> str:
    """The prediction's ``answer`` as text; a bare string counts as the answer itself."""
    return str(getattr(prediction, "answer", prediction) or "")


def exact_match(text: str, targets: Sequence[str]) -> bool:
    """Whether the reply's answer (its last "Answer:" line, else all of it) equals one of ``targets``."""
    answer = normalise(bare_answer(text))
    return answer in {normalise(t) for t in targets}


def numeric_match(text: str, target: float, rel_tol: float = 1e-6) -> bool:
    """Whether the last number of the reply's answer equals ``target`` within ``rel_tol`` (relative)."""
    value = extract_answer(text, float)
    return isinstance(value, int | float) and math.isclose(value, target, rel_tol=rel_tol)


# ---- metrics a config names (``exact``, ``number``, ``choice``): they read the example's ``answer`` -----------------
def exact_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction's answer is ``example.answer`` (trimmed, case-folded, no final full stop), else 0.0."""
    return float(exact_match(answer_text(prediction), [example.answer]))


def number_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if the last number of the prediction's answer equals ``example.answer`` (a number, commas allowed)."""
    return float(numeric_match(answer_text(prediction), float(str(example.answer).replace(",", ""))))


def contains_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if ``example.answer`` appears in the prediction's answer as whole words (both normalised: case-folded,
    spacing and a final full stop ignored), else 0.0: short free-form answers inside a chatty reply ("The capital
    of France is Paris." for "Paris"; "395" in "17 * 23 + 4 = 395")."""
    target = normalise(str(example.answer))
    found = re.search(rf"(?<!\w){re.escape(target)}(?!\w)", normalise(answer_text(prediction)))
    return float(bool(target) and found is not None)


def choice_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction picks the option labelled ``example.answer`` among ``example.options`` (by its label or
    its text, as ``choice_index`` reads a reply), else 0.0."""
    index = choice_index(answer_text(prediction), example.options)
    return float(index is not None and option_labels(len(example.options))[index] == example.answer)


BUILTIN_METRICS = {
    "exact": exact_metric,
    "number": number_metric,
    "choice": choice_metric,
    "contains": contains_metric,
}
"""The metrics a config may name without an import path."""


def checked_metric_name(name: str) -> str:
    """``name`` if a config may name it as its metric (a builtin one, or ``module:function``); else a ``ValueError``
    that lists the builtin ones."""
    if name in BUILTIN_METRICS or re.fullmatch(r"[\w.]+:[\w.]+", name):
        return name
    raise ValueError(
        f"unknown metric {name!r}{did_you_mean(name, BUILTIN_METRICS)}: name one of {', '.join(BUILTIN_METRICS)}, "
        "or a function of your own as 'module:function'"
    )


MetricName = Annotated[str, pydantic.AfterValidator(checked_metric_name)]
"""A config's ``metric`` field: a builtin metric's name or ``module:function``, checked when validated."""
