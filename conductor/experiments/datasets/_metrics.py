"""Answer checks shared by the benchmark metrics: exact text, numbers, and which lettered option a reply picks."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from conductor.modules import extract_answer

_SPACES = re.compile(r"\s+")
_DECORATION = "*_`'\" \t\n"


def answer_text(prediction: Any) -> str:
    """The prediction's ``answer`` as text; a bare string counts as the answer itself."""
    return str(getattr(prediction, "answer", prediction) or "")


def normalise(text: str) -> str:
    """Text as compared for exact match: trimmed, case-folded, inner spaces collapsed, trailing full stops dropped."""
    return _SPACES.sub(" ", text.strip()).casefold().rstrip(".").rstrip()


def exact_match(text: str, targets: Sequence[str]) -> bool:
    """Whether the reply's answer (its last "Answer:" line, else all of it) equals one of ``targets``."""
    answer = normalise(extract_answer(text).strip(_DECORATION))
    return answer in {normalise(t) for t in targets}


def numeric_match(text: str, target: float, rel_tol: float = 1e-6) -> bool:
    """Whether the last number of the reply's answer equals ``target`` within ``rel_tol`` (relative)."""
    value = extract_answer(text, float)
    return isinstance(value, int | float) and math.isclose(value, target, rel_tol=rel_tol)


def option_labels(count: int) -> list[str]:
    """Labels for ``count`` options: letters A, B, ... up to 26 options, numbers 1, 2, ... beyond."""
    return [chr(ord("A") + i) for i in range(count)] if count <= 26 else [str(i + 1) for i in range(count)]


def format_options(options: Sequence[str]) -> str:
    """The options as lines "A. text", to append to a question."""
    return "\n".join(f"{label}. {option}" for label, option in zip(option_labels(len(options)), options, strict=True))


def _label_pattern(labels: Sequence[str]) -> str:
    alternatives = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    return rf"(?:{alternatives})"


def choice_index(text: str, options: Sequence[str]) -> int | None:
    """Which of ``options`` (labelled by ``option_labels``) the reply picks, or None if it picks none clearly.

    Looks at the reply's answer (its last "Answer:" line, else all of it) and accepts, in this order: an option's
    exact text; a label alone, in any case, or leading the answer ("b", "(B)", "B)", "B. text", but not the first of
    several lines that list options, as a model echoing the question writes them); a label after
    "answer is", "option" or "choice" anywhere in the reply (the last one wins); the one option whose text the
    answer contains (an option inside a longer contained one doesn't count).
    """
    labels = option_labels(len(options))
    answer = extract_answer(text).strip(_DECORATION)
    reply = normalise(answer)
    normalised = [normalise(option) for option in options]
    if reply in normalised:
        return normalised.index(reply)
    label = _label_pattern(labels)
    alone = re.fullmatch(rf"\(?({label})\)?[.):]?", answer, re.IGNORECASE)
    listed = {m.upper() for m in re.findall(rf"(?m)^\s*\(?({label})\)?[.):\]]", answer)}
    leading = alone or (len(listed) < 2 and re.match(rf"\(?({label})\)?[.):\]]", answer))  # not an echoed list
    if leading:
        return labels.index(leading.group(1).upper())
    stated = re.findall(rf"\b(?i:answer|option|choice)(?:\s+is)?\s*[:=-]?\s*\(?({label})\)?(?!\w)", text)
    if stated:
        return labels.index(stated[-1])
    contained = {option for option in normalised if re.search(rf"(?<!\w){re.escape(option)}(?!\w)", reply)}
    outermost = [o for o in contained if not any(o != other and o in other for other in contained)]
    return normalised.index(outermost[0]) if len(outermost) == 1 else None


# ---- metrics a config names (``exact``, ``number``, ``choice``): they read the example's ``answer`` -----------------
def exact_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction's answer is ``example.answer`` (trimmed, case-folded, no final full stop), else 0.0."""
    return float(exact_match(answer_text(prediction), [example.answer]))


def number_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if the last number of the prediction's answer equals ``example.answer`` (a number, commas allowed)."""
    return float(numeric_match(answer_text(prediction), float(str(example.answer).replace(",", ""))))


def choice_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction picks the option labelled ``example.answer`` among ``example.options`` (by its label or
    its text, as ``choice_index`` reads a reply), else 0.0."""
    index = choice_index(answer_text(prediction), example.options)
    return float(index is not None and option_labels(len(example.options))[index] == example.answer)


BUILTIN_METRICS = {"exact": exact_metric, "number": number_metric, "choice": choice_metric}
"""The metrics a config may name without an import path."""
