"""The conductor LM's own call counts in the run's budget, tokens and cost, and never passes a limit."""

import dspy

from conductor.modules import Budget, Conductor, Price, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm

ONE_STEP = 'model_id = [0]\nsubtasks = ["solve it"]\naccess_list = [[]]'
RECURSIVE = 'model_id = [0, 1]\nsubtasks = ["solve it", "review"]\naccess_list = [[], "all"]'
KEEP = "model_id = []\nsubtasks = []\naccess_list = []"
QUESTION = "What is 40 + 2?"


def program(script, **options) -> Conductor:
    pool = WorkerPool([ScriptedWorker("solver", lambda _: "Answer: 42", price=Price(1.0, 1.0))])
    return Conductor(pool, scripted_lm(script), **options)


def test_the_conductor_s_tokens_count_in_the_prediction():
    prediction = program([ONE_STEP])(question=QUESTION)
    conductor = prediction.conductor_usage
    assert conductor.prompt_tokens > 0 and conductor.completion_tokens == len(ONE_STEP.split())
    (step,) = prediction.trace
    assert prediction.tokens == conductor.tokens + step.prompt_tokens + step.completion_tokens
    assert prediction.cost == step.cost  # a scripted (in-process) conductor is free


def test_the_conductor_s_call_writes_no_more_than_the_token_budget_leaves():
    free = program([ONE_STEP])(question=QUESTION)
    limit = free.conductor_usage.prompt_tokens + 3
    capped = program([ONE_STEP], budget=Budget(max_tokens=limit))(question=QUESTION)
    assert capped.conductor_usage.completion_tokens == 3  # cut at what was left: an unreadable workflow
    assert capped.tokens <= limit and capped.error is not None  # no tokens left for a step, fallback included


def test_a_budget_smaller_than_the_conductor_s_prompt_calls_nothing():
    tight = program([ONE_STEP], budget=Budget(max_tokens=5))
    prediction = tight(question=QUESTION)
    assert prediction.error.kind == "budget" and "conductor's own call" in prediction.error.message
    assert tight.orchestrate.lm.scripted_engine.prompts == []  # the conductor wasn't asked
    assert prediction.trace == [] and prediction.tokens == 0  # nor did the fallback worker run


def test_the_steps_get_only_what_the_conductor_left():
    free = program([ONE_STEP])(question=QUESTION)
    conductor_tokens = free.conductor_usage.tokens
    # enough for the conductor, not for the step's prompt and answer as well: the step is refused
    prediction = program([ONE_STEP], budget=Budget(max_tokens=conductor_tokens + 2))(question=QUESTION)
    assert prediction.error.kind == "budget"
    assert prediction.tokens <= conductor_tokens + 2


def test_an_api_conductor_of_unknown_price_cant_run_under_a_cost_budget():
    lm = dspy.LM("nosuchprovider/unpriced-model", cache=False, num_retries=0)
    pool = WorkerPool([ScriptedWorker("solver", lambda _: "Answer: 42")])
    prediction = Conductor(pool, lm, budget=Budget(max_cost=0.01))(question=QUESTION)
    assert prediction.error.kind == "budget"
    assert "nosuchprovider/unpriced-model" in prediction.error.message and "no known price" in prediction.error.message
    assert prediction.trace == []


def test_recursive_rounds_share_one_budget_with_the_conductor_s_calls():
    recursive = program([RECURSIVE, KEEP], max_depth=1)
    prediction = recursive(question=QUESTION)
    rounds = prediction.rounds
    assert len(rounds) == 2 and prediction.answer == "42"
    assert prediction.conductor_usage == rounds[0].conductor_usage + rounds[1].conductor_usage
    steps = sum(s.prompt_tokens + s.completion_tokens for s in prediction.trace)
    assert prediction.tokens == steps + prediction.conductor_usage.tokens
    # the revision round's call gets only what the first round left
    limit = rounds[0].tokens + rounds[1].conductor_usage.prompt_tokens + 2
    tight = program([RECURSIVE, KEEP], max_depth=1, budget=Budget(max_tokens=limit))(question=QUESTION)
    assert tight.tokens <= limit
