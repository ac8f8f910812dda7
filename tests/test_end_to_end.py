"""End to end on the real embedded models: SmolLM2 as conductor and worker, with a calculator tool."""

import pytest

from conductor import Conductor, WorkerPool
from conductor.local import local_lm
from conductor.testing import scripted_lm

pytestmark = pytest.mark.slow

POOL = {
    "workers": [
        {"name": "smollm2", "kind": "local", "model": "smollm2-135m-instruct", "max_tokens": 48, "temperature": 0},
        {"name": "calculator", "kind": "tool", "tool": "calculator"},
    ]
}


@pytest.fixture(scope="module")
def pool():
    return WorkerPool.from_config(POOL)


def test_smollm2_conductor_plans_and_the_local_pool_runs_it(pool):
    program = Conductor(pool, local_lm("smollm2-135m-instruct", max_tokens=160, temperature=0.0))
    prediction = program(question="What is 17 * 23 + 4?")
    assert prediction.conductor_text.strip()  # the conductor wrote something, parsed or not
    assert prediction.error is None or prediction.error.kind == "format"  # never a crash, never a failed run
    assert prediction.trace and all(step.output is not None for step in prediction.trace)
    first = prediction.trace[0]
    assert first.prompt_tokens > 0 and first.completion_tokens <= pool[first.worker_index].max_tokens
    steps = sum(s.prompt_tokens + s.completion_tokens for s in prediction.trace)
    assert prediction.conductor_usage.prompt_tokens > 0  # the conductor's own call counts too
    assert prediction.answer and prediction.tokens == steps + prediction.conductor_usage.tokens


def test_a_workflow_over_a_real_local_model_and_a_tool(pool):
    workflow = (
        'model_id = [0, 1]\nsubtasks = ["Say in one sentence how to compute 17 * 23 + 4.", "17 * 23 + 4"]\n'
        'access_list = [[], "all"]'
    )
    prediction = Conductor(pool, scripted_lm([workflow]), signature="question -> answer: int")(
        question="What is 17 * 23 + 4?"
    )
    assert prediction.error is None
    assert [s.worker for s in prediction.trace] == ["smollm2", "calculator"]
    smol = prediction.trace[0]
    assert smol.prompt_tokens > 50  # the tokenizer's exact count of the role instructions, task and subtask
    assert 0 < smol.completion_tokens <= 48 and smol.output
    assert prediction.answer == 395


def test_the_shipped_trained_conductor_routes_arithmetic_to_the_calculator(capsys):
    """The README's first command: the default program is the trained one, and it learned what the calculator is for
    (greedy decoding under its grammar, so this is deterministic)."""
    import json

    from conductor.cli import main

    assert main(["run", "What is 772 minus 949?", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [step["worker"] for step in out["steps"]] == ["calculator"] and out["answer"] == "-177"
