"""First-step instructions the search proposes from the training answers, beside the user's own.

A weak model told only to answer often answers in the wrong form (it repeats the options, or explains instead of
naming one); told the form, it can be right. Instruction proposers (DSPy's MIPRO) ground their proposals in a summary
of the data; here the summary is the form of the labelled answers, so a proposal costs no model call and is the same
on every run: a small closed set of answers proposes naming one of them, numbers propose the number alone. The search
scores a proposal like any other instruction, so one that does not help loses its rungs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import dspy

MAX_CHOICES = 5
"""The most distinct answers that still read as a closed set (True/False, the options of a multiple choice)."""


def proposed_subtasks(examples: Sequence[dspy.Example], fields: Iterable[str]) -> list[str]:
    """Instructions for each output field in ``fields`` whose labels in ``examples`` have a form. Answers that are not
    numbers and take a closed set of values (at most ``MAX_CHOICES``, each seen twice on average) propose naming one of
    them; numbers, when at least a quarter of the answers are, propose the number alone. A dataset mixing kinds of
    question (yes/no and sums) gets both, and the search finds which questions each one serves. A field is named
    only when there are several."""
    fields = list(fields)
    out = []
    for name in fields:
        answers = [str(e[name]).strip() for e in examples if e.get(name) is not None]
        what = "Answer" if len(fields) == 1 else f"Give the {name}"
        words = Counter(a for a in answers if not _is_number(a))
        if words and len(words) <= MAX_CHOICES and words.total() >= 2 * len(words):
            out.append(f"{what} with one of: {', '.join(sorted(words))}.")
        if answers and len(answers) - words.total() >= max(2, len(answers) / 4):
            out.append(f"{what} with the number only.")
    return out


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
