import logging
import math

import dspy
import pytest
from dspy.lm15 import ContextLengthError

from conductor.errors import ConfigError, WorkerError
from conductor.modules import LMWorker, Price, WorkerPool
from conductor.modules.workers import FREE, litellm_price, lm_price
from conductor.testing import scripted_lm
from tests.modules.worker_contract import WorkerContract


class TestScriptedLMWorkerContract(WorkerContract):
    @pytest.fixture
    def worker(self):
        return LMWorker("scripted", scripted_lm(lambda prompt: "one two three four five six seven"))

    @pytest.fixture
    def prompt_messages(self):
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]


def test_lm_worker_sends_system_and_turns_and_reads_usage():
    lm = scripted_lm(lambda prompt: "an answer")
    worker = LMWorker("w", lm, price=Price(1, 1))
    messages = [
        {"role": "system", "content": "SYSTEM"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "second"},
    ]
    completion = worker.complete(messages, max_tokens=10, temperature=0)
    assert completion.text == "an answer" and completion.output_tokens == 2
    assert completion.input_tokens == 4  # the scripted engine counts words of system + turns
    assert lm.scripted_engine.prompts[0] == "SYSTEM\n\nfirst\n\nreply\n\nsecond"


def test_a_request_that_can_never_fit_is_not_retryable_but_a_flaky_one_is():
    def too_long(_):
        raise ContextLengthError("prompt too long")

    def flaky(_):
        raise RuntimeError("connection reset")

    with pytest.raises(WorkerError) as permanent:
        LMWorker("w", scripted_lm(too_long)).complete([{"role": "user", "content": "x"}], max_tokens=5, temperature=0)
    with pytest.raises(WorkerError) as transient:
        LMWorker("w", scripted_lm(flaky)).complete([{"role": "user", "content": "x"}], max_tokens=5, temperature=0)
    assert permanent.value.retryable is False and transient.value.retryable is True
    assert "connection reset" in str(transient.value)


# ---- prices ------------------------------------------------------------------------------------------------------
def test_an_api_worker_without_a_price_is_priced_from_litellm_s_cost_map():
    worker = LMWorker("gpt", dspy.LM("openai/gpt-4o-mini", cache=False))
    assert worker.price == pytest.approx(Price(0.00015, 0.0006))  # litellm's local map: $0.15 / $0.60 per 1M tokens
    assert lm_price(dspy.LM("gpt-4o-mini")) == worker.price


def test_an_api_model_litellm_does_not_know_has_an_unknown_price_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        worker = LMWorker("mine", dspy.LM("openai/my-own-finetune", cache=False))
    assert worker.price is None and "no price for 'openai/my-own-finetune'" in caplog.text
    assert litellm_price("no-provider-model") is None and litellm_price("nonsense/model") is None


def test_in_process_models_are_free_and_a_given_price_wins():
    assert LMWorker("local", scripted_lm(lambda _: "x")).price == FREE  # a custom DSPy engine runs in-process
    given = Price(1.0, 2.0)
    assert LMWorker("gpt", dspy.LM("openai/gpt-4o-mini"), price=given).price is given


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_price_must_be_finite_and_not_negative(bad):
    with pytest.raises(ConfigError, match="prices must be finite and not negative"):
        Price(bad, 0.0)


def test_a_pool_config_prices_api_workers_from_litellm_unless_it_names_a_price():
    pool = WorkerPool.from_config(
        {
            "workers": [
                {"name": "gpt", "kind": "lm", "model": "openai/gpt-4o-mini"},
                {"name": "cheap", "kind": "lm", "model": "openai/gpt-4o-mini", "price": {"input_per_1k": 0.001}},
                {"name": "calc", "kind": "tool", "tool": "calculator"},
            ]
        }
    )
    assert pool[0].price == pytest.approx(Price(0.00015, 0.0006))
    assert pool[1].price == Price(0.001, 0.0) and pool[2].price == FREE
    with pytest.raises(ConfigError, match="input_per_1k"):
        WorkerPool.from_config({"workers": [{**pool.spec.workers[1].model_dump(), "price": {"input_per_1k": "nan"}}]})
