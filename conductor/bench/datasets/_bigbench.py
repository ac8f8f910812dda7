"""BIG-bench JSON tasks (the tasks BIG-Bench-Hard was drawn from among them), read out of the ``bigbench`` sdist.

PyPI no longer serves that sdist (gone on December 5, 2026): a machine that kept ``bigbench-1.0.0.tar.gz`` can copy
it into the dataset cache, where this loader reads it; elsewhere ``load_bbh`` has the 27 BIG-Bench-Hard tasks.

A task is ``benchmark_tasks/<task>/task.json`` or, for tasks split into subtasks, ``<task>/<subtask>/task.json``:
``{"task_prefix"?, "example_input_prefix"?, "preferred_score", "examples": [{"input", "target" | "target_scores"}]}``.
Only the task's folder is extracted from the 358 MB archive; the package is never installed (it needs TensorFlow).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import dspy

from conductor.bench.datasets._cache import Package, extract_tree
from conductor.bench.datasets._example import make_example
from conductor.bench.datasets._metrics import answer_text, exact_match
from conductor.errors import ConfigError
from conductor.modules import choice_index, format_options

BIGBENCH = Package(
    "bigbench",
    "1.0.0",
    "bigbench-1.0.0.tar.gz",
    sha256="1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
    withdrawn="gone since December 5, 2026; BIG-Bench-Hard's tasks: load_bbh",
)
_TASKS = "bigbench-1.0.0/bigbench/benchmark_tasks"
_NAME = re.compile(r"\w+")


def load_bigbench(task: str, subtask: str | None = None) -> list[dspy.Example]:
    """The examples of a BIG-bench JSON task, e.g. ``load_bigbench("navigate")``, ``load_bigbench("arithmetic")``
    (all its subtasks, in name order) or ``load_bigbench("logical_deduction", "three_objects")``.

    Examples with ``target_scores`` (when the task prefers multiple choice, or has no ``target``) become multiple
    choice: the options, shuffled by a fixed seed per question (some tasks list the right one first), are lettered
    under the question; ``options`` holds them and ``answers`` the right ones. Otherwise ``answers`` holds the
    accepted ``target`` strings. ``answer`` is the first of ``answers``; ``subtask`` names the subtask, if any.
    """
    for name in (task, subtask):
        if name is not None and not _NAME.fullmatch(name):
            raise ConfigError(f"not a BIG-bench task name: {name!r}")
    root = extract_tree(BIGBENCH, f"{_TASKS}/{task}")
    subtasks = sorted(p.parent.name for p in root.glob("*/task.json"))
    if subtask is not None:
        if subtask not in subtasks:
            raise ConfigError(f"BIG-bench task {task!r} has no subtask {subtask!r}; its subtasks: {subtasks or 'none'}")
        return _load(root / subtask / "task.json", task, subtask)
    top = root / "task.json"
    if top.is_file() and json.loads(top.read_text(encoding="utf-8")).get("examples"):
        return _load(top, task, None)
    if not subtasks:
        raise ConfigError(f"BIG-bench task {task!r} has no task.json with examples (a programmatic task.py task?)")
    return [example for name in subtasks for example in _load(root / name / "task.json", task, name)]


def _load(path: Path, task: str, subtask: str | None) -> list[dspy.Example]:
    spec = json.loads(path.read_text(encoding="utf-8"))
    prefixes = [spec.get("task_prefix", "").strip(), spec.get("example_input_prefix", "").strip()]
    prefers_choice = spec.get("preferred_score") == "multiple_choice_grade"
    return [_example(item, task, subtask, prefixes, prefers_choice) for item in spec["examples"]]


def _example(
    item: dict[str, Any], task: str, subtask: str | None, prefixes: list[str], prefers_choice: bool
) -> dspy.Example:
    task_prefix, input_prefix = prefixes
    text = f"{input_prefix} {item['input'].strip()}".strip()
    labels: dict[str, Any] = {"subtask": subtask, "options": None}
    if "target_scores" in item and (prefers_choice or "target" not in item):
        options = list(item["target_scores"])
        random.Random(f"{task}/{text}").shuffle(options)
        best = max(item["target_scores"].values())
        answers = tuple(option for option in options if item["target_scores"][option] == best)
        labels["options"] = tuple(options)
        text = f"{text}\n\nOptions:\n{format_options(options)}"
    else:
        target = item["target"]
        answers = tuple(map(str, target)) if isinstance(target, list) else (str(target),)
    question = f"{task_prefix}\n\n{text}" if task_prefix else text
    return make_example(question, answers[0], f"bigbench/{task}", answers=answers, **labels)


def bigbench_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """Multiple choice: 1.0 if the prediction picks a right option, by its text or its letter. Otherwise 1.0 if the
    prediction's answer equals a target after trimming, case-folding and dropping a final full stop. Else 0.0."""
    text = answer_text(prediction)
    if example.options:
        index = choice_index(text, example.options)
        return float(index is not None and example.options[index] in example.answers)
    return float(exact_match(text, example.answers))
