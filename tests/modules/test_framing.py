"""A worker's framing: under "plain", a step that answers the whole question on its own is the question alone (as a
user would call the model); so is any worker's step whose subtask is ``QUESTION_ALONE`` and that sees no earlier one;
every other step is the library's task prompt."""

from __future__ import annotations

import dspy
import pytest

from conductor.errors import ConfigError
from conductor.modules import Conductor, Executor, Step, WorkerPool, Workflow
from conductor.modules.baselines import SingleWorker
from conductor.modules.workflow import QUESTION_ALONE, WorkerPromptAdapter
from conductor.signatures import Solve
from conductor.testing import ScriptedWorker, scripted_lm
from tests.modules.framing import MIXED_POOL, UNSURE, config_models, formal, plainspoken

QUESTION = "What is the capital of France?"


def test_a_plain_worker_s_direct_step_is_the_question_alone() -> None:
    worker = ScriptedWorker("chat", plainspoken, framing="plain")
    prediction = SingleWorker(WorkerPool([worker]))(question=QUESTION)
    assert worker.messages == [[{"role": "user", "content": QUESTION}]]
    assert prediction.answer == "Paris" and prediction.tokens == len(QUESTION.split()) + 1


def test_a_task_worker_s_direct_step_keeps_the_task_prompt() -> None:
    worker = ScriptedWorker("chat", plainspoken)
    assert SingleWorker(WorkerPool([worker]))(question=QUESTION).answer == UNSURE
    (messages,) = worker.messages
    assert messages[0]["role"] == "system" and "Overall task:" in messages[-1]["content"]


@pytest.mark.parametrize("subtask", ["all", "All.", "the whole task", f"  {QUESTION.lower()} "])
def test_a_conductor_s_subtask_that_asks_for_the_whole_question_counts_as_direct(subtask: str) -> None:
    worker = ScriptedWorker("chat", plainspoken, framing="plain")
    result = Executor(WorkerPool([worker])).run(Workflow((Step(0, subtask, ()),)), QUESTION)
    assert result.answer == "Paris" and worker.messages == [[{"role": "user", "content": QUESTION}]]


def test_any_worker_s_step_whose_subtask_is_the_question_alone_gets_the_question_alone() -> None:
    # the conductor's choice per step: a task-framed model asked plain here, through the task prompt elsewhere
    worker = ScriptedWorker("chat", plainspoken)
    steps = (Step(0, QUESTION_ALONE, ()), Step(0, QUESTION_ALONE, "all"), Step(0, "all", ()))
    result = Executor(WorkerPool([worker]), max_parallel=1).run(Workflow(steps), QUESTION)
    alone, seen, task = worker.messages
    assert alone == [{"role": "user", "content": QUESTION}]
    assert "Earlier steps:" in seen[-1]["content"]  # a step that sees another needs the titles
    assert task[0]["role"] == "system"
    assert [step.output for step in result.steps] == ["Paris", UNSURE, UNSURE]


def test_a_plain_worker_keeps_the_task_prompt_where_it_needs_it() -> None:
    # a step that sees an earlier one, and a step with a subtask of its own, need the titles that tell them apart
    worker = ScriptedWorker("chat", plainspoken, framing="plain")
    steps = (Step(0, "all", ()), Step(0, "Check the answer above.", "all"), Step(0, "Name the country.", ()))
    result = Executor(WorkerPool([worker]), max_parallel=1).run(Workflow(steps), QUESTION)
    first, seen, own = worker.messages
    assert first == [{"role": "user", "content": QUESTION}]
    for messages in (seen, own):
        assert messages[0]["role"] == "system" and messages[-1]["content"].startswith("You are solving one subtask")
    assert "Earlier steps:" in seen[-1]["content"] and "Paris" in seen[-1]["content"]
    assert [step.output for step in result.steps] == ["Paris", UNSURE, UNSURE]


def test_a_role_with_demos_keeps_the_task_prompt() -> None:
    worker = ScriptedWorker("chat", plainspoken, framing="plain")
    program = SingleWorker(WorkerPool([worker]))
    program.roles["solve"].demos = [dspy.Example(question="Who wrote Hamlet?", subtask="all", response="Shakespeare")]
    program(question=QUESTION)
    (messages,) = worker.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]


def test_a_fallback_gets_the_prompt_of_its_own_framing() -> None:
    broken = ScriptedWorker("broken", fail_times=99, retries=0)
    chat = ScriptedWorker("chat", plainspoken, framing="plain")
    pool = WorkerPool([broken, chat], fallbacks={"broken": ["chat"]})
    prediction = SingleWorker(pool)(question=QUESTION)
    assert broken.messages[0][0]["role"] == "system"  # broken is task-framed
    assert chat.messages == [[{"role": "user", "content": QUESTION}]]
    assert prediction.answer == "Paris" and prediction.trace[0].answered_by == "chat"


def test_the_conductor_s_steps_follow_the_worker_s_framing() -> None:
    lm = scripted_lm(lambda _: 'model_id = [0, 1]\nsubtasks = ["all", "all"]\naccess_list = [[], []]')
    pool = WorkerPool([ScriptedWorker("chat", plainspoken, framing="plain"), ScriptedWorker("formal", formal)])
    prediction = Conductor(pool, lm)(question=QUESTION)
    assert [step.output for step in prediction.trace] == ["Paris", "Paris"]  # each in the framing it answers in


def test_an_unknown_framing_is_refused() -> None:
    with pytest.raises(ConfigError, match="framing must be one of"):
        ScriptedWorker("chat", framing="chatty")
    with pytest.raises(ConfigError, match="framing must be one of"):
        WorkerPromptAdapter("chatty")
    with pytest.raises(ConfigError, match="framing must be one of"):
        WorkerPool([ScriptedWorker("chat")]).framed({"chat": "chatty"})


def test_the_adapter_s_plain_prompt_needs_the_question() -> None:
    plain = WorkerPromptAdapter("plain")
    assert plain.format(Solve, [], {"question": QUESTION, "subtask": "all"}) == [{"role": "user", "content": QUESTION}]
    assert plain.format(Solve, [], {"question": QUESTION, "context": "", "subtask": "all"})[0]["role"] == "user"
    with_context = plain.format(Solve, [], {"question": QUESTION, "context": "Step 0 ...", "subtask": "all"})
    assert with_context[0]["role"] == "system"


# ---- in a pool config -----------------------------------------------------------------------------------------------
def test_a_pool_config_sets_a_model_s_framing_and_replay_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    config_models(monkeypatch)
    config = {
        "workers": [
            {"name": "chat", "kind": "local", "model": "plainspoken", "framing": "plain"},
            {"name": "again", "kind": "local", "model": "plainspoken", "framing": "plain", "replay": True},
            {"name": "formal", "kind": "local", "model": "formal"},
        ]
    }
    pool = WorkerPool.from_config(config)
    assert [w.framing for w in pool] == ["plain", "plain", "task"]
    assert [w.framing for w in pool.replayed()] == ["plain", "plain", "task"]
    assert SingleWorker(pool, 1)(question=QUESTION).answer == "Paris"  # through its ReplayWorker


def test_a_pool_config_refuses_a_bad_framing_and_a_framed_tool() -> None:
    with pytest.raises(ConfigError, match="framing"):
        WorkerPool.from_config({"workers": [{"name": "m", "kind": "lm", "model": "openai/x", "framing": "chatty"}]})
    with pytest.raises(ConfigError, match="`framing` is an option of models"):
        WorkerPool.from_config({"workers": [{"name": "c", "kind": "tool", "tool": "calculator", "framing": "plain"}]})


def test_framed_copies_the_workers_it_changes_and_says_so_in_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config_models(monkeypatch)
    pool = WorkerPool.from_config(MIXED_POOL)
    framed = pool.framed({"chat": "plain", "formal": "task"})
    assert [w.framing for w in framed] == ["plain", "task", "task"] and pool[0].framing == "task"
    assert framed[1] is pool[1] and framed[2] is pool[2] and framed[0] is not pool[0]
    assert [w.framing for w in framed.spec.workers] == ["plain", "task", "task"]
    assert [w.framing for w in pool.spec.workers] == ["task", "task", "task"]
    with pytest.raises(ConfigError, match="'calc' is a tool") as refused:
        pool.replayed().framed({"calc": "plain", "nobody": "plain"})
    assert "no worker named 'nobody'" in str(refused.value)
