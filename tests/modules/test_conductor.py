import dspy
import pytest

from conductor import ConfigError
from conductor.modules import Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm

TWO_STEPS = 'Plan, then solve.\nmodel_id = [0, 1]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'


def make_pool():
    return WorkerPool(
        [ScriptedWorker("planner", lambda _: "1. add"), ScriptedWorker("solver", lambda _: "So.\nAnswer: 42")]
    )


def test_conductor_writes_a_workflow_that_the_pool_runs():
    pool = make_pool()
    prediction = Conductor(pool, scripted_lm([TWO_STEPS]))(question="What is 40 + 2?")
    assert prediction.answer == "42"  # the "Answer:" line of the last step
    assert prediction.response == "So.\nAnswer: 42"
    assert prediction.error is None
    assert [s.worker for s in prediction.trace] == ["planner", "solver"]
    steps = sum(s.prompt_tokens + s.completion_tokens for s in prediction.trace)
    assert prediction.conductor_usage.tokens > 0 and steps > 0  # the conductor's own call counts too
    assert prediction.tokens == steps + prediction.conductor_usage.tokens
    assert prediction.workflow.reasoning == "Plan, then solve."
    assert prediction.conductor_text == TWO_STEPS


def test_the_conductor_prompt_shows_workers_by_id_only_unless_the_pool_opts_in():
    pool = WorkerPool([ScriptedWorker("secret-name", description="a big model")])
    lm = scripted_lm(['model_id=[0]\nsubtasks=["x"]\naccess_list=["all"]'] * 2)
    Conductor(pool, lm)(question="q")
    assert "Model 0" in lm.scripted_engine.prompts[0] and "secret-name" not in lm.scripted_engine.prompts[0]
    pool.show_descriptions = True
    Conductor(pool, lm)(question="q")
    assert "Model 0: a big model" in lm.scripted_engine.prompts[1]


def test_typed_output_field_is_extracted():
    program = Conductor(make_pool(), scripted_lm([TWO_STEPS]), signature="question -> answer: int")
    assert program(question="What is 40 + 2?").answer == 42


@pytest.mark.parametrize(
    "conductor_text, problem",
    [
        ("I would ask the solver.", "missing list: model_id"),
        ('model_id = [9]\nsubtasks = ["x"]\naccess_list = ["all"]', "unknown worker 9 (the pool has workers 0..1)"),
        ('model_id = [0, 1]\nsubtasks = ["x", "y"]\naccess_list = [[1], "all"]', "refers to a later step (1)"),
    ],
)
def test_unusable_workflow_falls_back_to_worker_0_and_records_the_format_error(conductor_text, problem):
    pool = make_pool()
    prediction = Conductor(pool, scripted_lm([conductor_text]))(question="q")
    assert prediction.error.kind == "format" and problem in prediction.error.message
    assert prediction.response == "1. add"  # worker 0 answered directly
    assert pool[1].calls == 0
    assert prediction.conductor_text == conductor_text


def test_without_fallback_an_unusable_workflow_calls_no_worker():
    pool = make_pool()
    prediction = Conductor(pool, scripted_lm(["nonsense"]), fallback="none")(question="q")
    assert prediction.error.kind == "format" and prediction.answer == "" and prediction.workflow is None
    assert pool[0].calls == pool[1].calls == 0


def test_a_failed_run_is_an_execution_error_not_a_format_error():
    pool = WorkerPool([ScriptedWorker("broken", fail_times=10, retries=0)])
    prediction = Conductor(pool, scripted_lm(['model_id=[0]\nsubtasks=["x"]\naccess_list=[[]]']))(question="q")
    assert prediction.error.kind == "execution" and prediction.answer == ""
    assert len(prediction.trace) == 1 and prediction.trace[0].error


@pytest.mark.parametrize(
    "question, problem", [("", "the question is empty"), ("   ", "the question is empty"), ("x" * 1_000_000, "limit")]
)
def test_bad_questions_are_refused_before_any_call(question, problem):
    pool, lm = make_pool(), scripted_lm([])
    prediction = Conductor(pool, lm)(question=question)
    assert prediction.error.kind == "input" and problem in prediction.error.message
    assert lm.scripted_engine.prompts == [] and pool[0].calls == 0


def test_missing_input_field_is_an_input_error():
    prediction = Conductor(make_pool(), scripted_lm([]))(query="q")
    assert prediction.error.kind == "input" and "question" in prediction.error.message


def test_multi_input_signature_renders_each_field():
    lm = scripted_lm([TWO_STEPS])
    Conductor(make_pool(), lm, signature="context, question -> answer")(
        context="Paris is in France.", question="Where?"
    )
    assert "context: Paris is in France.\nquestion: Where?" in lm.scripted_engine.prompts[0]


def test_predictors_are_visible_to_optimizers_and_survive_save_and_load(tmp_path):
    program = Conductor(make_pool())  # the conductor LM is not part of the saved state here
    names = [name for name, _ in program.named_predictors()]
    assert names[0] == "orchestrate" and "roles['verify']" in names
    program.orchestrate.signature = program.orchestrate.signature.with_instructions("Be brief.")
    program.orchestrate.demos = [
        dspy.Example(
            question="q",
            workers="Model 0",
            available_roles="solve",
            max_steps=5,
            reasoning="r",
            model_id=[0],
            subtasks=["answer"],
            access_list=["all"],
            roles=None,
        )
    ]
    program.save(tmp_path / "program.json")
    loaded = Conductor(make_pool())
    loaded.load(tmp_path / "program.json")
    assert loaded.orchestrate.signature.instructions == "Be brief."
    assert loaded.orchestrate.demos[0]["subtasks"] == ["answer"]


def test_few_shot_workflows_reach_the_conductor_prompt_in_the_workflow_format():
    lm = scripted_lm([TWO_STEPS])
    program = Conductor(make_pool(), lm)
    program.orchestrate.demos = [
        dspy.Example(
            question="2+2?",
            workers="Model 0",
            available_roles="solve",
            max_steps=5,
            reasoning="easy",
            model_id=[1],
            subtasks=["compute 2+2"],
            access_list=[[]],
            roles=None,
        )
    ]
    program(question="q")
    assert 'subtasks = ["compute 2+2"]' in lm.scripted_engine.prompts[0]


def test_a_user_role_is_usable_without_library_changes():
    class Critique(dspy.Signature):
        """Point out the weakest part of the earlier answer."""

        context: str = dspy.InputField()
        subtask: str = dspy.InputField()
        critique: str = dspy.OutputField()

    pool = make_pool()
    text = 'model_id = [0, 1]\nsubtasks = ["answer", "criticise"]\naccess_list = [[], "all"]\nroles = ["", "critique"]'
    program = Conductor(pool, scripted_lm([text]), roles=[*__import__("conductor").signatures.BUILTIN_ROLES, Critique])
    prediction = program(question="q")
    assert prediction.error is None and prediction.trace[1].role == "critique"
    assert pool[1].messages[0][0]["content"] == Critique.instructions
    assert "critique" in [n.split("'")[1] for n, _ in program.named_predictors() if "roles" in n]


def test_a_role_the_executor_cannot_fill_is_a_config_error():
    class NeedsDocs(dspy.Signature):
        """x"""

        documents: str = dspy.InputField()
        answer: str = dspy.OutputField()

    with pytest.raises(ConfigError, match="can't fill: \\['documents'\\]"):
        Conductor(make_pool(), scripted_lm([]), roles=[NeedsDocs])


@pytest.mark.parametrize(
    "code, problem",
    [
        ("while True:\n    pass", "ran past its time limit of 1 s"),
        ("x = ' ' * 10**9", "MemoryError"),  # one allocation past the limit: fails at once, even under load
    ],
)
def test_runaway_code_in_the_sandbox_is_a_clear_error_and_the_process_survives(code, problem):
    from conductor.modules.tools import PythonWorker

    pool = WorkerPool([PythonWorker(code_timeout_s=1, memory_mb=256)])
    subtask = f"Run this:\n```python\n{code}\n```"
    text = f"model_id = [0]\nsubtasks = {__import__('json').dumps([subtask])}\naccess_list = [[]]"
    prediction = Conductor(pool, scripted_lm([text]))(question="q")
    reported = prediction.error.message if prediction.error else prediction.response
    assert problem in reported


def test_a_completion_is_read_into_a_workflow_or_a_format_error_and_never_raises():
    program = Conductor(make_pool())
    reply = program.read_completion(TWO_STEPS)
    assert reply.error is None and reply.text == TWO_STEPS and [s.worker for s in reply.workflow.steps] == [0, 1]
    for text, problem in [
        ("no lists", "missing list: model_id"),
        ('model_id = [2]\nsubtasks = ["x"]\naccess_list = [[]]', "unknown worker 2"),
        ("model_id = []\nsubtasks = []\naccess_list = []", "no steps"),  # only a recursive round may keep the answer
    ]:
        reply = program.read_completion(text)
        assert reply.workflow is None and reply.text == text
        assert reply.error.kind == "format" and problem in reply.error.message
