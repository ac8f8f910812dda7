"""Recursive rounds: the conductor names itself as the last step's worker, then keeps or rewrites the answer."""

import json

import pytest

from conductor import ConfigError
from conductor.deploy import load_program, save_program
from conductor.modules import Budget, Conductor, Price, Step, WorkerPool, Workflow
from conductor.optimizers import BudgetTuner
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.helpers import POOL_CONFIG, fixed_lm

SELF_LAST = 'model_id = [0, 2]\nsubtasks = ["solve it", "check it"]\naccess_list = [[], "all"]'
KEEP = "model_id = []\nsubtasks = []\naccess_list = []"
NEW = 'model_id = [1]\nsubtasks = ["solve it again"]\naccess_list = [[]]'


def make_pool():
    """Worker 0 answers 41, worker 1 answers 42; the conductor is Model 2."""
    price = Price(input_per_1k=1.0, output_per_1k=2.0)
    return WorkerPool(
        [
            ScriptedWorker("first", lambda _: "Answer: 41", price=price),
            ScriptedWorker("second", lambda _: "Answer: 42", price=price),
        ]
    )


def run(script, *, max_depth=1, **options):
    pool, lm = make_pool(), scripted_lm(script)
    prediction = Conductor(pool, lm, max_depth=max_depth, **options)(question="What is 40 + 2?")
    return prediction, pool, lm.scripted_engine.prompts


def test_without_recursion_the_conductor_is_not_offered_and_has_no_revise_predictor():
    prediction, _, prompts = run([SELF_LAST], max_depth=0)
    assert "Workers:\nModel 0\nModel 1\n\nAvailable roles" in prompts[0]
    assert prediction.error.kind == "format" and "unknown worker 2 (the pool has workers 0..1)" in str(prediction.error)
    assert [p.conductor_text for p in prediction.rounds] == [SELF_LAST]
    assert "revise" not in [name for name, _ in Conductor(make_pool()).named_predictors()]


def test_an_empty_round_keeps_the_answer_it_saw():
    prediction, pool, prompts = run([SELF_LAST, KEEP])
    assert "Model 2: yourself, the conductor (only as the last step)" in prompts[0]
    assert "Previous workflow:\n" + SELF_LAST in prompts[1] and "Previous answer:\nAnswer: 41" in prompts[1]
    assert "Workers:\nModel 0\nModel 1\n\n" in prompts[1]  # no round is left: the conductor is not offered again
    assert prediction.answer == "41" and prediction.error is None and pool[1].calls == 0
    assert prediction.workflow.steps == (Step(0, "solve it", ()),)  # what ran, without the conductor's own step
    assert prediction.conductor_text == SELF_LAST
    assert [p.conductor_text for p in prediction.rounds] == [SELF_LAST, KEEP]
    assert [p.answer for p in prediction.rounds] == ["41", "41"] and prediction.rounds[1].trace == []


def test_a_new_workflow_replaces_the_answer_and_the_run_counts_every_round():
    prediction, _, _ = run([SELF_LAST, NEW])
    assert prediction.answer == "42" and prediction.error is None
    assert prediction.workflow == Workflow((Step(1, "solve it again", ()),))
    assert [s.worker for s in prediction.trace] == ["first", "second"]
    first, second = prediction.rounds
    assert (first.answer, second.answer) == ("41", "42") and len(first.trace) == len(second.trace) == 1
    assert prediction.tokens == first.tokens + second.tokens > 0
    assert prediction.cost == pytest.approx(first.cost + second.cost) and prediction.cost > first.cost > 0


def test_rounds_stop_at_max_depth():
    prediction, _, prompts = run(lambda _: SELF_LAST, max_depth=2)
    assert len(prompts) == 3 and len(prediction.rounds) == 3  # the first round and two recursive ones, no more
    assert prediction.error.kind == "format"
    assert "Model 2 is you, the conductor, and no recursive round is left (max_depth=2)" in prediction.error.message
    assert prediction.answer == "41"  # the answer of the last round that gave one


@pytest.mark.parametrize(
    "text, problem",
    [
        ('model_id = [2, 0]\nsubtasks = ["x", "y"]\naccess_list = [[], "all"]', "step 0: Model 2 is you, the conduc"),
        ('model_id = [2]\nsubtasks = ["x"]\naccess_list = [[]]', "a worker must answer before you review the answer"),
    ],
)
def test_the_conductor_may_only_be_the_last_of_several_steps(text, problem):
    prediction, _, prompts = run([text])
    assert prediction.error.kind == "format" and problem in prediction.error.message
    assert len(prompts) == 1 and prediction.response == "Answer: 41"  # the fallback answered; no recursive round


def test_a_format_error_in_a_recursive_round_keeps_the_answer_and_records_the_error():
    prediction, pool, _ = run([SELF_LAST, "I am not sure."])
    assert prediction.answer == "41" and prediction.workflow.steps[0].worker == 0
    assert prediction.error.kind == "format" and "missing list: model_id" in prediction.error.message
    assert prediction.rounds[1].error == prediction.error and prediction.rounds[1].conductor_text == "I am not sure."
    assert pool[0].calls == 1 and pool[1].calls == 0  # no fallback in a recursive round


def test_the_rounds_share_the_runs_budget():
    prediction, pool, _ = run([SELF_LAST, NEW], budget=Budget(max_steps=1))
    assert pool[0].calls == 1 and pool[1].calls == 0  # round 1 used the only step
    assert prediction.error.kind == "budget" and prediction.answer == "41"


def test_check_sees_every_workflow_about_to_run_without_the_conductors_step():
    program = Conductor(make_pool(), scripted_lm([SELF_LAST, NEW]), max_depth=1)
    seen = []
    program.run_reply("q", program.ask("q"), check=lambda workflow, error: seen.append(workflow))
    assert [[s.worker for s in w.steps] for w in seen] == [[0], [1]]


def test_max_depth_is_checked_and_brings_the_revise_predictor():
    with pytest.raises(ConfigError, match="max_depth must be at least 0"):
        Conductor(make_pool(), max_depth=-1)
    program = Conductor(make_pool(), max_depth=1)
    assert "revise" in [name for name, _ in program.named_predictors()]
    program.max_depth = 0
    assert "revise" not in [name for name, _ in program.named_predictors()]


def test_a_budget_trial_applies_the_recursion_depth():
    program = Conductor(make_pool())
    configured = BudgetTuner(lambda example, prediction: 1.0).apply(program, {"max_steps": 3, "recursion_depth": 2})
    assert configured.max_depth == 2 and configured.revise is not None and program.max_depth == 0


def test_save_and_load_keep_max_depth_and_the_revise_prompt(tmp_path):
    program = Conductor(WorkerPool.from_config(POOL_CONFIG), fixed_lm(), max_depth=2)
    program.revise.signature = program.revise.signature.with_instructions("Keep it unless it is wrong.")
    folder = save_program(program, tmp_path / "program")
    loaded = load_program(folder, trust_code=True)
    assert loaded.max_depth == 2 and loaded.revise.signature.instructions == "Keep it unless it is wrong."
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["max_depth"]  # a program saved before recursion existed
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert load_program(folder, trust_code=True).max_depth == 0


def test_reading_a_completion_applies_the_rules_of_its_round():
    program = Conductor(make_pool(), max_depth=1)
    assert program.read_completion(SELF_LAST).error is None  # round 0: a recursive round is left
    assert program.read_completion(KEEP, depth=1).workflow == Workflow((), "")  # keep the answer
    refused = program.read_completion(SELF_LAST, depth=1)
    assert refused.workflow is None and "no recursive round is left (max_depth=1)" in refused.error.message
