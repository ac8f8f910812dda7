"""The bench method ``plain_chat``: a model called with the question alone, as a user would call it without this
library, counted like every other method; a tool has no chat and is refused."""

from __future__ import annotations

import pytest

from conductor.bench import MethodSpec
from conductor.errors import ConfigError
from conductor.modules import WorkerPool
from conductor.modules.tools import CalculatorWorker
from conductor.testing import ScriptedWorker
from tests.modules.framing import UNSURE, plainspoken

QUESTION = "Who wrote Hamlet?"


def method(kind: str, worker: int) -> MethodSpec:
    return MethodSpec.model_validate({"name": kind, "type": kind, "args": {"worker": worker}})


def test_plain_chat_sends_the_question_alone_and_counts_the_call() -> None:
    model = ScriptedWorker("chat", plainspoken)
    pool = WorkerPool([model, CalculatorWorker()])
    prediction = method("plain_chat", 0).build(pool, seed=0)(question=QUESTION)
    assert prediction.answer == "Shakespeare" and prediction.error is None
    assert model.messages == [[{"role": "user", "content": QUESTION}]]
    (step,) = prediction.trace
    assert (step.prompt_tokens, step.completion_tokens) == (3, 1) and prediction.tokens == 4
    assert pool[0].framing == "task"  # the experiment's pool is left as it was: other methods share it
    assert method("single", 0).build(pool, seed=0)(question=QUESTION).answer == UNSURE  # the library's prompt


def test_plain_chat_refuses_a_tool_and_a_worker_the_pool_lacks() -> None:
    pool = WorkerPool([ScriptedWorker("chat", plainspoken), CalculatorWorker()])
    with pytest.raises(ConfigError, match="'calculator' is a tool"):
        method("plain_chat", 1).build(pool, seed=0)
    with pytest.raises(ConfigError, match="worker 2 is not in the pool"):
        method("plain_chat", 2).build(pool, seed=0)
