import math
from collections import Counter

import pytest

from conductor import ConfigError, Price
from conductor.bench.simulated import (
    PAPER_FAMILIES,
    PAPER_MODELS,
    SimulatedModel,
    SimulatedWorker,
    simulated_dataset,
    simulated_metric,
    simulated_pool,
    simulated_task,
)
from conductor.errors import ToolInputError
from conductor.modules import extract_answer
from conductor.modules.baselines import MixtureOfAgents, SelfConsistency, SingleWorker
from tests.modules.worker_contract import WorkerContract

TOY = SimulatedModel("toy", {"toy": 0.3}, Price(0.001, 0.002), mean_output_tokens=50)


def accuracy(program, examples) -> float:
    return sum(simulated_metric(e, program(**e.inputs())) for e in examples) / len(examples)


@pytest.mark.parametrize("model, family", [("gemini-2.5-pro", "math500"), (TOY, "toy")])
def test_a_simulated_worker_answers_with_its_configured_accuracy(model, family):
    pool = simulated_pool([model], seed=3)
    expected = pool[0].model.accuracy[family]
    measured = accuracy(SingleWorker(pool), simulated_dataset([family], 2000, seed=11))
    assert abs(measured - expected) < 4 * math.sqrt(expected * (1 - expected) / 2000)


def test_the_same_seeds_give_the_same_run_and_other_seeds_another():
    examples = simulated_dataset(["mmlu", "rlpr"], 10, seed=1)
    assert examples == simulated_dataset(["mmlu", "rlpr"], 10, seed=1)
    assert [e.answer for e in examples] != [e.answer for e in simulated_dataset(["mmlu", "rlpr"], 10, seed=2)]

    def run(seed):
        program = MixtureOfAgents(simulated_pool(seed=seed), aggregator=0)
        return [(p.response, p.tokens) for p in (program(**e.inputs()) for e in examples)]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_prices_produce_costs():
    pool = simulated_pool(["claude-sonnet-4", "gemma-3-27b"])
    prediction = MixtureOfAgents(pool, aggregator=1)(**simulated_dataset(["mmlu"], 1)[0].inputs())
    for step in prediction.trace:
        price = pool[step.worker_index].price
        assert step.cost > 0 and step.cost == pytest.approx(price.cost(step.prompt_tokens, step.completion_tokens))
    assert prediction.cost == pytest.approx(sum(s.cost for s in prediction.trace))
    assert pool[0].price == PAPER_MODELS["claude-sonnet-4"].price


def test_self_consistency_samples_differ_unless_the_temperature_is_0():
    examples = simulated_dataset(["toy"], 20)

    def distinct_answers(temperature):
        program = SelfConsistency(simulated_pool([TOY], temperature=temperature, correlation=0), k=5)
        traces = [program(**e.inputs()).trace for e in examples]
        return [len({extract_answer(s.output) for s in trace}) for trace in traces]

    assert max(distinct_answers(0.2)) > 1
    assert distinct_answers(0.0) == [1] * len(examples)


@pytest.mark.parametrize("copy_prob", [0.0, 1.0])
def test_a_step_that_sees_earlier_answers_copies_their_majority_with_copy_prob(copy_prob):
    pool = simulated_pool([TOY, *(SimulatedModel(f"toy{i}", {"toy": 0.3}) for i in range(4))], copy_prob=copy_prob)
    program = MixtureOfAgents(pool, proposers=[1, 2, 3, 4], aggregator=0)
    copied = 0
    for example in simulated_dataset(["toy"], 100):
        prediction = program(**example.inputs())
        votes = Counter(extract_answer(s.output) for s in prediction.trace[:-1])
        copied += prediction.answer == votes.most_common(1)[0][0]
    assert copied == 100 if copy_prob == 1 else copied < 100


def test_an_answer_that_runs_out_of_tokens_is_lost():
    pool = simulated_pool([TOY], max_tokens=20)
    predictions = [SingleWorker(pool)(**e.inputs()) for e in simulated_dataset(["toy"], 50)]
    cut = [p for p in predictions if "cut off" in p.response]
    assert cut and all("Answer:" not in p.response and p.trace[0].completion_tokens == 20 for p in cut)
    assert all(p.trace[0].completion_tokens <= 20 for p in predictions)


def test_everything_simulated_says_so():
    pool = simulated_pool()
    assert all(w.name.startswith("sim-") and "SIMULATED" in w.description for w in pool)
    example = simulated_dataset(["math500"], 1)[0]
    assert example.question.startswith("SIMULATED") and example.family == "sim/math500"
    assert "SIMULATED" in SingleWorker(pool)(**example.inputs()).response
    assert simulated_task(example.task_id).answer == example.answer


def test_the_paper_calibration_keeps_the_papers_best_single_worker():
    averages = {name: sum(m.accuracy[f] for f in PAPER_FAMILIES) / 4 for name, m in PAPER_MODELS.items()}
    assert averages["gemini-2.5-pro"] == pytest.approx(0.6414)
    assert max(averages, key=averages.get) == "gemini-2.5-pro"


def test_questions_a_simulated_worker_cannot_answer_fail_without_retries():
    pool = simulated_pool(["gpt-5"])
    prediction = SingleWorker(pool)(**simulated_dataset(["toy"], 1)[0].inputs())
    assert prediction.error.kind == "execution" and "no accuracy for family 'toy'" in prediction.error.message
    assert prediction.trace[0].attempts == 1
    with pytest.raises(ToolInputError, match="no simulated task"):
        pool[0].complete([{"role": "user", "content": "What is 2 + 2?"}], max_tokens=10, temperature=0)


@pytest.mark.parametrize(
    "build, problem",
    [
        (lambda: simulated_pool(["gpt-6"]), "unknown simulated models"),
        (lambda: simulated_pool(copy_prob=1.5), "copy_prob must be a probability"),
        (lambda: SimulatedWorker(SimulatedModel("x", {"toy": 2.0})), "toy must be a probability"),
        (lambda: simulated_dataset(["a:b"], 1), "can't be empty"),
    ],
)
def test_bad_settings_are_config_errors(build, problem):
    with pytest.raises(ConfigError, match=problem):
        build()


class TestSimulatedWorkerContract(WorkerContract):
    @pytest.fixture
    def worker(self):
        return SimulatedWorker(TOY)

    @pytest.fixture
    def prompt_messages(self):
        return [{"role": "user", "content": simulated_dataset(["toy"], 1)[0].question}]
