import pytest
from dspy.lm15 import ContextLengthError

from conductor.errors import WorkerError
from conductor.modules import LMWorker, Price
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
