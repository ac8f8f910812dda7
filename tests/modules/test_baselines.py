import logging
import re

import pytest

from conductor import Budget, ConfigError
from conductor.modules import Conductor, WorkerPool, Workflow
from conductor.modules.baselines import (
    FixedPipeline,
    MixtureOfAgents,
    OneStepRouter,
    RandomWorkflow,
    SelfConsistency,
    SingleWorker,
    plan_solve_verify,
    solve_verify_refine,
)
from conductor.signatures import Aggregate, Plan, Verify
from conductor.testing import ScriptedWorker, scripted_lm


def pool_of(n: int = 3, **scripts) -> WorkerPool:
    """Workers w0..w{n-1}; each answers "<name> says\\nAnswer: <name>" unless ``scripts`` gives it a script."""
    return WorkerPool(
        [ScriptedWorker(f"w{i}", scripts.get(f"w{i}", lambda _, i=i: f"w{i} says\nAnswer: w{i}")) for i in range(n)]
    )


def calls(pool: WorkerPool) -> list[int]:
    return [worker.calls for worker in pool]


def test_single_worker_asks_only_its_worker_and_returns_the_conductors_fields():
    pool = pool_of()
    prediction = SingleWorker(pool, worker=2)(question="q")
    assert calls(pool) == [0, 0, 1]
    assert prediction.answer == "w2" and prediction.response == "w2 says\nAnswer: w2"
    assert prediction.error is None and prediction.conductor_text == ""
    assert [(s.worker, s.visible) for s in prediction.trace] == [("w2", ())]
    assert prediction.tokens == prediction.trace[0].prompt_tokens + prediction.trace[0].completion_tokens
    conductor = Conductor(pool, scripted_lm(['model_id=[0]\nsubtasks=["x"]\naccess_list=[[]]']))(question="q")
    assert set(prediction.keys()) == set(conductor.keys())


def by_sample(*responses: str):
    """A script that gives sample i of a self-consistency run ``responses[i - 1]``, whatever order they run in."""
    return lambda prompt: responses[int(re.search(r"sample (\d+) of", prompt)[1]) - 1]


def test_self_consistency_takes_the_majority_answer_and_the_winning_samples_response():
    pool = pool_of(2, w1=by_sample("a\nAnswer: 3", "b\nAnswer: 5", "c\nAnswer:  5 ", "d\nAnswer: 3", "e\nAnswer: 5"))
    prediction = SelfConsistency(pool, worker=1, k=5)(question="q")
    assert calls(pool) == [0, 5]
    assert prediction.answer == "5" and prediction.response == "b\nAnswer: 5"
    assert [s.visible for s in prediction.trace] == [()] * 5  # independent samples
    assert len({s.subtask for s in prediction.trace}) == 5  # no two prompts alike: no cache can merge them


def test_self_consistency_votes_ignore_case_and_spacing_and_ties_go_to_the_first():
    pool = pool_of(1, w0=by_sample("x\nAnswer: Paris", "y\nAnswer: Lyon", "z\nAnswer:  paris", "v\nAnswer: Lyon"))
    assert SelfConsistency(pool, k=4)(question="q").response == "x\nAnswer: Paris"


def test_self_consistency_reads_typed_answers_before_voting():
    pool = pool_of(1, w0=by_sample("It is 42.\nAnswer: 42", "Answer: 41", "So 42.0"))
    prediction = SelfConsistency(pool, k=3, signature="question -> answer: int")(question="q")
    assert prediction.answer == 42 and prediction.response == "It is 42.\nAnswer: 42"


def test_self_consistency_warns_when_its_samples_cannot_differ(caplog):
    pool = WorkerPool([ScriptedWorker("greedy", temperature=0.0)])
    with caplog.at_level(logging.WARNING):
        SelfConsistency(pool, k=3)
    assert "temperature 0" in caplog.text


def test_a_failed_sample_leaves_self_consistency_without_an_answer():
    pool = WorkerPool([ScriptedWorker("broken", fail_times=10, retries=0)])
    prediction = SelfConsistency(pool, k=3)(question="q")
    assert prediction.error.kind == "execution" and prediction.answer == ""
    assert prediction.trace and all(step.error for step in prediction.trace)


def test_baselines_share_the_executors_budget():
    pool = pool_of(1)
    prediction = SelfConsistency(pool, k=3, budget=Budget(max_steps=2))(question="q")
    assert prediction.error.kind == "budget" and prediction.answer == "" and calls(pool) == [2]


def test_mixture_of_agents_aggregator_sees_every_proposal():
    pool = pool_of(4)
    prediction = MixtureOfAgents(pool, proposers=[0, 1, 2], aggregator=3)(question="q")
    assert calls(pool) == [1, 1, 1, 1]
    aggregator_prompt = pool[3].prompts[0]
    assert all(f"w{i} says" in aggregator_prompt for i in range(3))
    assert pool[3].messages[0][0]["content"] == Aggregate.instructions
    assert "w0 says" not in pool[1].prompts[0]  # proposers see nothing
    assert [s.visible for s in prediction.trace] == [(), (), (), (0, 1, 2)]
    assert prediction.answer == "w3"


def test_mixture_of_agents_defaults_to_every_worker_as_proposer():
    pool = pool_of(3)
    prediction = MixtureOfAgents(pool, aggregator=0)(question="q")
    assert calls(pool) == [2, 1, 1] and [s.role for s in prediction.trace][-1] == "aggregate"


def test_plan_solve_verify_gives_each_step_its_role_and_access():
    pool = pool_of()
    prediction = plan_solve_verify(pool, planner=0, solver=1, verifier=2)(question="q")
    assert [(s.worker, s.role, s.visible) for s in prediction.trace] == [
        ("w0", "plan", ()),
        ("w1", "solve", (0,)),
        ("w2", "verify", (0, 1)),
    ]
    assert pool[0].messages[0][0]["content"] == Plan.instructions
    assert pool[2].messages[0][0]["content"] == Verify.instructions
    assert prediction.answer == "w2"


def test_solve_verify_refine_gives_each_step_its_role_and_access():
    prediction = solve_verify_refine(pool_of(), solver=0, verifier=1, refiner=0)(question="q")
    assert [(s.worker, s.role, s.visible) for s in prediction.trace] == [
        ("w0", "solve", ()),
        ("w1", "verify", (0,)),
        ("w0", "refine", (0, 1)),
    ]


def test_fixed_pipeline_takes_explicit_access_lists():
    pool = pool_of()
    program = FixedPipeline(pool, [(0, "solve", "a", []), (1, "solve", "b", []), (2, "", "c", [0])])
    prediction = program(question="q")
    assert [s.visible for s in prediction.trace] == [(), (), (0,)]
    assert prediction.trace[2].role == "solve"  # "" is the default role
    assert "w1 says" not in pool[2].prompts[0] and "w0 says" in pool[2].prompts[0]


@pytest.mark.parametrize(
    "steps, problem",
    [
        ([(9, "solve", "x")], "unknown worker 9"),
        ([(0, "judge", "x")], "unknown role 'judge'"),
        ([(0, "solve", "x", [0])], "refers to itself"),
        ([], "no steps"),
        ([(0, "solve")], "(worker, role, subtask)"),
    ],
)
def test_a_fixed_pipeline_the_pool_cannot_run_is_refused_when_built(steps, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        FixedPipeline(pool_of(), steps)


def test_random_workflows_are_valid_and_reproducible_per_question():
    pool = pool_of()
    program = RandomWorkflow(pool, max_steps=4, seed=7)
    questions = [f"question {i}" for i in range(200)]
    workflows = [program.workflow_for(q) for q in questions]
    for workflow in workflows:
        assert workflow.problems(len(pool)) == []
        assert 1 <= len(workflow) <= 4 and "final answer" in workflow.steps[-1].subtask
    assert {len(w) for w in workflows} == {1, 2, 3, 4}
    assert {s.worker for w in workflows for s in w.steps} == {0, 1, 2}
    assert {s.access for w in workflows for s in w.steps} == {"all", ()}
    assert [RandomWorkflow(pool, max_steps=4, seed=7).workflow_for(q) for q in reversed(questions)] == workflows[::-1]
    assert [RandomWorkflow(pool, max_steps=4, seed=8).workflow_for(q) for q in questions] != workflows


def test_random_workflow_runs_the_workflow_it_drew():
    pool = pool_of()
    program = RandomWorkflow(pool, seed=1)
    prediction = program(question="q")
    assert prediction.workflow == program.workflow_for("q")
    assert [s.worker_index for s in prediction.trace] == [s.worker for s in prediction.workflow.steps]
    assert sum(calls(pool)) == len(prediction.workflow)


def test_one_step_router_refuses_a_two_step_workflow_as_a_format_error():
    pool = pool_of(2)
    text = 'model_id = [1, 1]\nsubtasks = ["a", "b"]\naccess_list = [[], "all"]'
    prediction = OneStepRouter(pool, scripted_lm([text]))(question="q")
    assert prediction.error.kind == "format" and "too many steps: 2 > max_steps=1" in prediction.error.message
    assert calls(pool) == [1, 0]  # the fallback answered, not the router's workflow


def test_one_step_router_runs_the_worker_it_picked():
    pool, lm = pool_of(2), scripted_lm(['model_id = [1]\nsubtasks = ["answer it"]\naccess_list = [[]]'])
    prediction = OneStepRouter(pool, lm)(question="q")
    assert prediction.error is None and prediction.answer == "w1" and calls(pool) == [0, 1]
    assert "single worker" in lm.scripted_engine.prompts[0]


@pytest.mark.parametrize(
    "make",
    [
        lambda pool: SingleWorker(pool),
        lambda pool: SelfConsistency(pool, k=2),
        lambda pool: MixtureOfAgents(pool),
        lambda pool: RandomWorkflow(pool),
    ],
)
def test_bad_inputs_are_refused_before_any_call(make):
    pool = pool_of()
    program = make(pool)
    assert program(query="q").error.kind == "input"
    assert program(question=" ").error.kind == "input"
    assert sum(calls(pool)) == 0


def test_baselines_hold_ordinary_workflows_and_role_predictors_optimizers_see():
    program = MixtureOfAgents(pool_of(), aggregator=1)
    assert Workflow.parse(program.workflow.to_text()) == program.workflow
    assert "roles['aggregate']" in [name for name, _ in program.named_predictors()]


def test_a_fixed_rule_method_without_its_rule_cannot_be_built():
    from conductor.modules.baselines._base import WorkflowProgram

    class Unfinished(WorkflowProgram):
        pass

    with pytest.raises(TypeError, match="abstract method workflow_for"):
        Unfinished(pool_of())
