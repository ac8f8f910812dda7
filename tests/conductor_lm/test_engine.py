"""The policy as a ``dspy.LM``: raw requests, ``dspy.Predict``, the ``Conductor`` module, and engine state."""

from __future__ import annotations

from pathlib import Path

import dspy
import pytest
from dspy.lm15 import Config, ContextLengthError, Message, Request

from conductor.conductor_lm import ConductorLM, Sample
from conductor.errors import ConductorError
from conductor.local import LocalEngine, trainable_policy
from conductor.modules import Conductor, WorkerPool
from conductor.modules.workflow import WorkerPromptAdapter
from conductor.testing import ScriptedWorker
from tests.conductor_lm.helpers import ForceText

TWO_STEPS = 'Plan, then solve.\nmodel_id = [0, 1]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'


def test_a_request_returns_text_and_token_usage(tiny: ConductorLM) -> None:
    seen: list[Sample] = []
    lm = tiny.as_dspy_lm(max_tokens=6, on_sample=seen.append)
    assert lm.model == "conductor/tiny"
    request = Request(model=lm.model, messages=(Message.user("hi"),), system="Be brief.")
    response = lm(request)
    assert isinstance(response.text, str)
    assert response.finish_reason in ("stop", "length")
    (sample,) = seen
    assert response.usage.input_tokens == len(sample.prompt_ids) == len(tiny.encode(_chat("Be brief.", "hi")))
    assert response.usage.output_tokens == len(sample.token_ids) <= 6
    assert lm(request).text == response.text  # greedy by default


def _chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_request_settings_are_honoured(tiny: ConductorLM) -> None:
    seen: list[Sample] = []
    lm = tiny.as_dspy_lm(on_sample=seen.append)

    def ask(**config: object) -> None:
        lm(Request(model=lm.model, messages=(Message.user("hi"),), config=Config(**config)))

    ask(max_tokens=3, temperature=1.0, seed=5)
    ask(max_tokens=3, temperature=1.0, seed=5)
    ask(max_tokens=3, temperature=1.0, seed=6)
    assert [len(s.token_ids) for s in seen] == [3, 3, 3]
    assert seen[0] == seen[1] and seen[0].token_ids != seen[2].token_ids


def test_the_engine_works_inside_dspy_predict(tiny: ConductorLM) -> None:
    lm = tiny.as_dspy_lm(max_tokens=16, logits_processor=ForceText(tiny, "forty-two"))
    with dspy.context(lm=lm, adapter=WorkerPromptAdapter()):
        prediction = dspy.Predict("question -> answer")(question="What is 40 + 2?")
    assert prediction.answer == "forty-two"
    assert len(lm.history) == 1  # DSPy recorded the call like any other LM's


def test_the_trained_policy_plugs_into_the_conductor_module(tiny: ConductorLM) -> None:
    pool = WorkerPool([ScriptedWorker("planner", lambda _: "1. add"), ScriptedWorker("solver", lambda _: "Answer: 42")])
    samples: list[Sample] = []
    lm = tiny.as_dspy_lm(max_tokens=200, logits_processor=ForceText(tiny, TWO_STEPS), on_sample=samples.append)
    prediction = Conductor(pool, lm)(question="What is 40 + 2?")
    assert prediction.error is None
    assert prediction.answer == "42"
    assert [s.worker for s in prediction.trace] == ["planner", "solver"]
    assert prediction.conductor_text == TWO_STEPS
    (sample,) = samples  # what GRPO would train on
    assert tiny.decode(sample.token_ids) == TWO_STEPS


def test_an_untrained_policy_gives_a_format_error_not_a_crash(tiny: ConductorLM) -> None:
    pool = WorkerPool([ScriptedWorker("solver", lambda _: "Answer: 1")])
    prediction = Conductor(pool, tiny.as_dspy_lm(max_tokens=16))(question="q")
    assert prediction.error is not None and prediction.error.kind == "format"


def test_engine_state_points_at_the_saved_policy(tiny: ConductorLM, tmp_path: Path) -> None:
    engine = tiny.engine(temperature=0.0, max_tokens=7)
    with pytest.raises(ConductorError, match="never saved"):
        engine.dump_state()
    tiny.save(tmp_path / "policy")
    state = engine.dump_state()
    assert state == {
        "model_class": "conductor.conductor_lm._model:ConductorLM",
        "path": str((tmp_path / "policy").absolute()),
        "temperature": 0.0,
        "max_tokens": 7,
    }
    restored = LocalEngine.load_state(state)
    request = Request(model="conductor/tiny", messages=(Message.user("hi"),))
    assert restored.complete(request).text == engine.complete(request).text
    engine.close()
    # and through a saved DSPy program
    predict = dspy.Predict("question -> answer")
    predict.lm = tiny.as_dspy_lm(max_tokens=7)
    loaded = dspy.Predict("question -> answer")
    loaded.load_state(predict.dump_state(), allow_unsafe_lm_state=True)
    assert isinstance(loaded.lm.engine, LocalEngine)
    assert trainable_policy(loaded.lm).saved_to == tiny.saved_to and loaded.lm.engine.max_tokens == 7


def test_a_prompt_longer_than_the_context_window_is_refused(tiny: ConductorLM) -> None:
    engine = tiny.engine()
    request = Request(model="conductor/tiny", messages=(Message.user("x" * 5000),))
    with pytest.raises(ContextLengthError, match="context window of 4096 tokens"):
        engine.complete(request)


def test_a_prompt_near_the_context_window_gets_a_shorter_completion(tiny: ConductorLM) -> None:
    """``max_tokens`` shrinks to what the window leaves, and the completion cut there finishes with "length"."""
    text = "x" * (tiny.context_window - 3 - len(tiny.encode([{"role": "user", "content": ""}])))
    engine = tiny.engine(max_tokens=50, logits_processor=ForceText(tiny, "a long answer"))
    response = engine.complete(Request(model="conductor/tiny", messages=(Message.user(text),)))
    assert response.usage.input_tokens == tiny.context_window - 3
    assert (response.usage.output_tokens, response.finish_reason, response.text) == (3, "length", "a l")
