"""Scripted models whose answer depends on how the prompt is framed, for the tests of ``Worker.framing``.

``plainspoken`` answers right only when its prompt is the question alone (as a user asks it), ``formal`` only when it
is the library's task prompt (the preamble, "Overall task:", "Your subtask:"), ``steady`` in either. Each question's
answer is a word, so a wrong framing is a wrong answer. ``config_models`` makes pool configs build them from ``kind:
local`` entries (their ``model`` names the script), so a pool with them can be saved and loaded.
"""

from __future__ import annotations

import dspy
import pytest

from conductor.modules.pool import _pool
from conductor.modules.workflow._prompts import INPUT_TITLES, WORKER_PREAMBLE
from conductor.testing import ScriptedWorker

ANSWERS = {
    "What is the capital of France?": "Paris",
    "Who wrote Hamlet?": "Shakespeare",
    "What colour is the sky?": "blue",
    "How many legs has a spider?": "eight",
}
UNSURE = "Your subtask is correct."


def question_in(prompt: str) -> str:
    """The question of a task-framed prompt (its "Overall task" section), or the prompt itself."""
    title = f"{INPUT_TITLES['question']}:\n"
    return prompt.split(title, 1)[1].split("\n\n", 1)[0] if title in prompt else prompt


def plainspoken(prompt: str) -> str:
    return ANSWERS.get(prompt, UNSURE)


def formal(prompt: str) -> str:
    return ANSWERS.get(question_in(prompt), UNSURE) if prompt.startswith(WORKER_PREAMBLE) else UNSURE


def steady(prompt: str) -> str:
    return ANSWERS.get(question_in(prompt), UNSURE)


SCRIPTS = {"plainspoken": plainspoken, "formal": formal, "steady": steady}


def examples() -> list[dspy.Example]:
    return [dspy.Example(question=q, answer=a).with_inputs("question") for q, a in ANSWERS.items()]


def right(example: dspy.Example, prediction: dspy.Prediction, trace: object = None) -> bool:
    return prediction.answer == example.answer


def config_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool configs build ``kind: local`` workers as the scripted model their ``model`` names (no real model)."""
    build = lambda spec, options: ScriptedWorker(spec.name, SCRIPTS[spec.model], **options)  # noqa: E731
    monkeypatch.setitem(_pool._WORKER_KINDS, "local", build)


MIXED_POOL = {
    "workers": [
        {"name": "chat", "kind": "local", "model": "plainspoken"},
        {"name": "formal", "kind": "local", "model": "formal"},
        {"name": "calc", "kind": "tool", "tool": "calculator"},
    ]
}
"""A model better asked plainly, one better asked in the task framing, and a tool (build it after ``config_models``)."""
