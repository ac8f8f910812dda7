"""``Conductor(worker_ids="names")``: workflows name workers by their pool names, so a workflow keeps its meaning when
the pool is reordered, shrunk or grown (with numbers, ``Model 1`` is whoever sits second)."""

import dspy
import pytest

from conductor import ConfigError
from conductor.modules import SELF_NAME, Conductor, Step, WorkerPool, Workflow
from conductor.testing import ScriptedWorker, scripted_lm

BY_NAME = 'model_id = ["planner", "solver"]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'


def make_pool() -> WorkerPool:
    return WorkerPool(
        [
            ScriptedWorker("planner", lambda _: "1. add", description="writes plans"),
            ScriptedWorker("solver", lambda _: "Answer: 42", description="solves"),
            ScriptedWorker("guesser", lambda _: "Answer: 7", description="guesses"),
        ],
        show_descriptions=True,
    )


def test_the_prompt_lists_workers_by_name_and_asks_for_names() -> None:
    lm = scripted_lm([BY_NAME])
    prediction = Conductor(make_pool(), lm, worker_ids="names")(question="What is 40 + 2?")
    prompt = lm.scripted_engine.prompts[0]
    assert "planner: writes plans\nsolver: solves\nguesser: guesses" in prompt and "Model 0:" not in prompt
    assert 'model_id = ["<worker name>", "<worker name>"]' in prompt
    assert [s.worker for s in prediction.trace] == ["planner", "solver"] and prediction.answer == "42"


@pytest.mark.parametrize(
    ("order", "workers"),
    [
        ([0, 1, 2], [0, 1]),
        ([2, 1, 0], [2, 1]),  # reversed: the same workers, at other places
        ([1, 0], [1, 0]),  # without the guesser
    ],
)
def test_a_workflow_by_name_runs_the_same_workers_in_any_order_or_subset(order: list[int], workers: list[int]) -> None:
    program = Conductor(make_pool(), worker_ids="names").copy_with(pool=make_pool().subset(order))
    reply = program.read_completion(BY_NAME)
    assert reply.error is None and [s.worker for s in reply.workflow.steps] == workers
    prediction = program.run_reply("What is 40 + 2?", reply)
    assert [s.worker for s in prediction.trace] == ["planner", "solver"] and prediction.answer == "42"


def test_a_worker_the_pool_lacks_is_a_format_error_that_lists_the_names() -> None:
    program = Conductor(make_pool().subset([1, 2]), worker_ids="names")
    reply = program.read_completion(BY_NAME)
    assert reply.workflow is None and reply.error.kind == "format"
    assert "'planner'" in reply.error.message and "solver, guesser" in reply.error.message


def test_numbers_and_names_in_any_case_are_read_too() -> None:
    program = Conductor(make_pool(), worker_ids="names")
    reply = program.read_completion(BY_NAME.replace('"planner"', '"Model 2"').replace('"solver"', '" Solver "'))
    assert [s.worker for s in reply.workflow.steps] == [2, 1]


def test_demos_and_the_previous_workflow_are_written_by_name() -> None:
    lm = scripted_lm([BY_NAME])
    program = Conductor(make_pool(), lm, worker_ids="names")
    program.orchestrate.demos = [
        dspy.Example(
            question="2+2?",
            workers="guesser",
            available_roles="solve",
            max_steps=5,
            reasoning="",
            model_id=[2],  # demos keep the places the run had: written back by name
            subtasks=["guess"],
            access_list=[[]],
            roles=None,
        )
    ]
    program(question="q")
    assert 'model_id = ["guesser"]' in lm.scripted_engine.prompts[0]
    assert program.workflow_text(Workflow((Step(1, "solve it", ()),))).startswith('model_id = ["solver"]')


def test_a_recursive_conductor_names_itself() -> None:
    program = Conductor(make_pool(), worker_ids="names", max_depth=1)
    assert program.workflow_names == ("planner", "solver", "guesser", SELF_NAME)
    assert f"{SELF_NAME}: yourself" in program.prompt_messages("q")[-1]["content"]
    reply = program.read_completion(BY_NAME.replace('"solver"]', f'"{SELF_NAME}"]'))
    assert reply.error is None and reply.workflow.steps[-1].worker == program.own_id
    last_round = program.read_completion(BY_NAME.replace('"solver"]', f'"{SELF_NAME}"]'), depth=1)
    assert f"step 1: {SELF_NAME} is you" in last_round.error.message


def test_a_worker_named_like_the_conductor_is_refused() -> None:
    pool = WorkerPool([ScriptedWorker("Conductor", lambda _: "1")])
    with pytest.raises(ConfigError, match="no worker may be named 'conductor'"):
        Conductor(pool, worker_ids="names").prompt_messages("q")


def test_the_choice_is_part_of_the_programs_config() -> None:
    program = Conductor(make_pool(), worker_ids="names")
    assert program.config().worker_ids == "names"
    assert Conductor.from_config(program.config(), make_pool()).worker_ids == "names"
    assert Conductor(make_pool()).worker_ids == "numbers"
    with pytest.raises(ConfigError, match="worker_ids"):
        Conductor(make_pool(), worker_ids="places")
