"""A ``Conductor`` as a first-class DSPy program: stock optimizers compile it without the project's wrappers, it runs
under ``acall``, DSPy callbacks see every step, and DSPy tools, modules and plain callables are workers."""

from __future__ import annotations

import asyncio
import json
import re

import dspy
import pytest
from dspy.utils.callback import BaseCallback

from conductor.errors import ConfigError
from conductor.modules import Conductor, LMWorker, ModuleWorker, ToolWorker, WorkerPool, as_worker
from conductor.modules.workflow import is_workflow_demo
from conductor.testing import ScriptedWorker, scripted_lm
from tests.modules.worker_contract import WorkerContract


def workflow(worker: int, subtask: str) -> str:
    return f'model_id = [{worker}]\nsubtasks = ["{subtask}"]\naccess_list = [[]]'


GOOD = workflow(1, "compute it exactly")  # the solver answers right
BAD = workflow(0, "guess")  # the guesser answers wrong


def make_pool() -> WorkerPool:
    return WorkerPool(
        [ScriptedWorker("guesser", lambda _: "Answer: 0"), ScriptedWorker("solver", lambda _: "Answer: 42")]
    )


def examples(*questions: str) -> list[dspy.Example]:
    return [dspy.Example(question=q, answer="42").with_inputs("question") for q in questions]


def exact(example, prediction, trace=None) -> float:
    return float(prediction.answer == example.answer)


def last_question(prompt: str) -> str:
    return re.findall(r"Question:\n(.*)", prompt)[-1]  # demos come first; the last question is the one asked


def demo_conductor() -> dspy.LM:
    """Answers ``easy`` questions with the right workflow; ``hard`` ones only once a right workflow is among the
    demos in its prompt (so a compiled program is measurably better than its student)."""

    def respond(prompt: str) -> str:
        if last_question(prompt).startswith("easy") or 'subtasks = ["compute it exactly"]' in prompt:
            return GOOD
        return BAD

    return scripted_lm(respond)


# ---- the conductor LM is part of the program ---------------------------------------------------------------------
def test_the_conductor_lm_survives_reset_copy_deepcopy_and_a_state_without_lms(tmp_path):
    lm = scripted_lm(lambda _: GOOD)
    program = Conductor(make_pool(), lm)
    program.orchestrate.demos = [dspy.Example(question="q", answer="42")]
    reset = program.reset_copy()
    assert reset.orchestrate.lm is lm and reset.orchestrate.demos == []  # the demos are learned state, the LM isn't
    copied = program.deepcopy()
    assert copied.orchestrate.lm is lm and copied.orchestrate is not program.orchestrate  # shared, like the pool
    assert copied.executor.roles["solve"] is copied.roles["solve"]  # the copy's steps use the copy's role prompts
    assert copied(question="q").answer == "42"
    program.orchestrate.lm = None
    program.save(tmp_path / "state.json")
    loaded = Conductor(make_pool(), lm)
    loaded.load(tmp_path / "state.json")
    assert loaded.orchestrate.lm is lm


def test_lms_set_aside_leaves_them_out_of_the_state_and_puts_them_back_even_after_an_error():
    lm, role_lm = scripted_lm(lambda _: GOOD), scripted_lm(lambda _: "Answer: 42")
    program = Conductor(make_pool(), lm)
    program.roles["solve"].lm = role_lm
    with program.lms_set_aside():
        state = program.dump_state()
    assert state and all(predictor["lm"] is None for predictor in state.values())
    assert (program.orchestrate.lm, program.roles["solve"].lm) == (lm, role_lm)
    with pytest.raises(RuntimeError, match="saving failed"), program.lms_set_aside():
        raise RuntimeError("saving failed")
    assert (program.orchestrate.lm, program.roles["solve"].lm) == (lm, role_lm)


def test_labeled_demos_without_a_workflow_are_left_out_of_the_prompts():
    lm = scripted_lm(lambda _: GOOD)
    pool = make_pool()
    program = Conductor(pool, lm)
    labeled = dspy.Example(question="What is 6 * 7?", answer="42")
    with_workflow = labeled.copy(workers="Model 0\nModel 1", model_id=[1], subtasks=["multiply"], access_list=[[]])
    program.orchestrate.demos = [labeled, with_workflow]
    program.roles["solve"].demos = [labeled, dspy.Example(question="2 + 2?", response="Answer: 4")]
    assert program(question="q").answer == "42"
    conductor_prompt, worker_prompt = lm.scripted_engine.prompts[0], pool[1].messages[0]
    assert conductor_prompt.count("What is 6 * 7?") == 1 and 'subtasks = ["multiply"]' in conductor_prompt
    assert [m["content"] for m in worker_prompt if m["role"] == "assistant"] == ["Answer: 4"]
    assert [is_workflow_demo(d) for d in program.orchestrate.demos] == [False, True]


# ---- stock DSPy optimizers ---------------------------------------------------------------------------------------
def test_labeled_few_shot_compiles_and_the_result_runs():
    lm = demo_conductor()
    workflows = [
        example.copy(workers="Model 0\nModel 1", model_id=[1], subtasks=["compute it exactly"], access_list=[[]])
        for example in examples("easy 1")
    ]
    compiled = dspy.LabeledFewShot(k=2).compile(Conductor(make_pool(), lm), trainset=examples("hard 1") + workflows)
    assert compiled.orchestrate.lm is lm and len(compiled.orchestrate.demos) == 2
    assert compiled(question="hard 2").answer == "42"  # the workflow example reached the prompt


def test_bootstrap_few_shot_bootstraps_workflows_and_the_result_runs():
    lm = demo_conductor()
    student = Conductor(make_pool(), lm)
    assert student(question="hard 1").answer == "0"
    optimizer = dspy.BootstrapFewShot(metric=exact, max_bootstrapped_demos=2, max_labeled_demos=2)
    compiled = optimizer.compile(student, trainset=examples("easy 1", "easy 2", "hard 3"))
    demos = compiled.orchestrate.demos
    assert [is_workflow_demo(d) for d in demos] == [True, True, False, False][: len(demos)]
    assert demos[0]["model_id"] == [1] and demos[0]["subtasks"] == ["compute it exactly"]
    assert compiled.roles["solve"].demos[0]["response"] == "Answer: 42"  # the worker steps' traces, too
    assert compiled(question="hard 9").answer == "42"
    assert student.orchestrate.demos == [] and compiled.orchestrate.lm is lm


def test_a_workflow_that_cannot_run_never_becomes_a_demo():
    pool = WorkerPool([ScriptedWorker("solver", lambda _: "Answer: 42")])
    student = Conductor(pool, scripted_lm(lambda _: workflow(7, "no such worker")))
    assert student(question="q").answer == "42"  # the fallback answered right, so a stock metric passes the run
    optimizer = dspy.BootstrapFewShot(metric=exact, max_bootstrapped_demos=2, max_labeled_demos=0)
    compiled = optimizer.compile(student, trainset=examples("q1", "q2"))
    assert compiled.orchestrate.demos == []
    assert compiled.roles["solve"].demos[0]["response"] == "Answer: 42"  # the step that ran is a real run's step


def test_bootstrap_few_shot_with_random_search_keeps_the_best_candidate():
    lm = demo_conductor()
    optimizer = dspy.BootstrapFewShotWithRandomSearch(
        metric=exact, max_bootstrapped_demos=1, max_labeled_demos=0, num_candidate_programs=2, num_threads=1
    )
    compiled = optimizer.compile(
        Conductor(make_pool(), lm), trainset=examples("easy 1", "easy 2"), valset=examples("hard 1", "hard 2")
    )
    assert compiled.orchestrate.lm is lm and any(is_workflow_demo(d) for d in compiled.orchestrate.demos)
    assert compiled(question="hard 9").answer == "42"


def test_mipro_v2_searches_the_conductor_instructions_and_the_result_runs():
    pytest.importorskip("optuna")
    lm = scripted_lm(lambda prompt: GOOD if "PREFER MODEL 1" in prompt else BAD)
    proposals = iter(["Be brief.", "PREFER MODEL 1 for every step."] * 50)

    def propose(prompt: str) -> str:  # fills whatever output fields DSPy's proposer asks for
        block = prompt.split("Your output fields are:")[1].split("\n\n")[0]
        values = {n: next(proposals) if "instruction" in n else f"some {n}" for n in re.findall(r"`(\w+)`", block)}
        if "JSON object" in prompt:
            return json.dumps(values)
        return "\n\n".join([*(f"[[ ## {n} ## ]]\n{v}" for n, v in values.items()), "[[ ## completed ## ]]"])

    optimizer = dspy.MIPROv2(
        metric=exact,
        prompt_model=scripted_lm(propose, "scripted/proposer"),
        task_model=lm,
        auto=None,
        num_candidates=2,
        max_bootstrapped_demos=0,
        max_labeled_demos=0,
        num_threads=1,
        seed=0,
    )
    student = Conductor(make_pool(), lm)
    compiled = optimizer.compile(
        student,
        trainset=examples("hard 1", "hard 2"),
        valset=examples("hard 3", "hard 4"),
        num_trials=3,
        minibatch=False,
    )
    assert "PREFER MODEL 1" in compiled.orchestrate.signature.instructions
    assert compiled.orchestrate.lm is lm and compiled(question="hard 9").answer == "42"


# ---- async, callbacks --------------------------------------------------------------------------------------------
def test_acall_runs_the_program_without_blocking_the_event_loop():
    pool = WorkerPool([ScriptedWorker("slow", lambda _: "Answer: 42", delay_s=0.3)])
    program = Conductor(pool, scripted_lm(lambda _: workflow(0, "x")))

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        with dspy.context(track_usage=True):
            first, second = await asyncio.gather(program.acall(question="q1"), program.acall(question="q2"))
        ticker.cancel()
        return first, second, ticks

    first, second, ticks = asyncio.run(main())
    assert first.answer == second.answer == "42" and first.error is None
    assert ticks >= 10  # the loop kept running while the workers slept
    assert first.get_lm_usage()  # DSPy's usage tracking saw the conductor LM's call


class Recorder(BaseCallback):
    def __init__(self):
        self.events: list[tuple] = []

    def on_module_start(self, call_id, instance, inputs):
        self.events.append(("module", instance, inputs))

    def on_module_end(self, call_id, outputs, exception=None):
        self.events.append(("module end", outputs, exception))

    def on_tool_start(self, call_id, instance, inputs):
        self.events.append(("tool", instance, inputs))

    def on_tool_end(self, call_id, outputs, exception=None):
        self.events.append(("tool end", outputs, exception))

    def on_lm_start(self, call_id, instance, inputs):
        self.events.append(("lm", instance, inputs))


def test_dspy_callbacks_see_the_conductor_call_each_role_step_and_the_tool_call():
    def double(number: str) -> str:
        """Doubles a number."""
        return str(2 * int(number))

    worker_lm = scripted_lm(lambda _: "Answer: 21", "scripted/worker")
    pool = WorkerPool([LMWorker("writer", worker_lm), dspy.Tool(double)])
    text = 'model_id = [0, 1]\nsubtasks = ["name a number", "21"]\naccess_list = [[], "all"]\nroles = ["plan", ""]'
    program = Conductor(pool, scripted_lm([text]))
    recorder = Recorder()
    with dspy.context(callbacks=[recorder]):
        prediction = program(question="Double 21.")
    assert prediction.answer == "42"
    starts = [(kind, instance) for kind, instance, _ in recorder.events if kind in ("module", "tool", "lm")]
    assert starts == [
        ("module", program),
        ("module", program.orchestrate),
        ("lm", program.orchestrate.lm),
        ("module", program.roles["plan"]),
        ("lm", worker_lm),
        ("module", program.roles["solve"]),
        ("tool", pool[1].tool),
    ]
    plan = next(inputs for kind, instance, inputs in recorder.events if instance is program.roles["plan"])
    assert plan["kwargs"]["subtask"] == "name a number" and plan["kwargs"]["question"] == "Double 21."
    tool_inputs = next(inputs for kind, _, inputs in recorder.events if kind == "tool")
    assert tool_inputs == {"kwargs": {"number": "21"}}  # the subtask, as the tool's one argument
    ends = [outputs for kind, outputs, _ in recorder.events if kind == "module end"]
    assert ends[0]["model_id"] == [0, 1]  # the conductor's workflow, then each step's response
    assert [end["response"] for end in ends[1:3]] == ["Answer: 21", "42"]
    assert ("tool end", "42", None) in recorder.events


def test_a_step_no_worker_answers_reaches_the_callbacks_as_an_exception():
    pool = WorkerPool([ScriptedWorker("broken", fail_times=5, retries=0)])
    recorder = Recorder()
    with dspy.context(callbacks=[recorder]):
        prediction = Conductor(pool, scripted_lm([workflow(0, "x")]))(question="q")
    assert prediction.error.kind == "execution"
    step_end = [event for event in recorder.events if event[0] == "module end"][1]
    assert step_end[1] is None and "scripted failure" in str(step_end[2])


# ---- tools, modules and callables as workers ---------------------------------------------------------------------
def test_a_dspy_tool_gets_the_subtask_and_its_type_error_is_not_retried():
    calls = []

    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        calls.append((a, b))
        return a + b

    pool = WorkerPool([dspy.Tool(add)])
    assert isinstance(pool[0], ToolWorker) and pool[0].name == "add" and pool[0].description == "Adds two numbers."
    ok = Conductor(pool, scripted_lm([workflow(0, '{\\"a\\": 40, \\"b\\": 2}')]))(question="q")
    assert ok.answer == "42" and calls == [(40, 2)]

    def broken(text):
        raise TypeError("broken() got an unexpected keyword argument")

    program = Conductor(WorkerPool([as_worker(broken, retries=3)]), scripted_lm([workflow(0, "x")] * 3))
    for _ in range(3):  # three retryable failures in a row would cool the worker down
        failed = program(question="q")
        assert failed.error.kind == "execution" and "TypeError" in failed.error.message
        assert failed.trace[0].attempts == 1  # not retried
    assert program.executor.health.cooldown_left("broken") == 0


def test_a_dspy_module_and_a_plain_callable_are_workers():
    class Shout(dspy.Module):
        def forward(self, subtask: str) -> dspy.Prediction:
            return dspy.Prediction(answer=subtask.upper())

    module_lm = scripted_lm(lambda _: "[[ ## reasoning ## ]]\nthink\n\n[[ ## answer ## ]]\n42\n\n[[ ## completed ## ]]")
    thinker = dspy.ChainOfThought("question -> answer")
    thinker.set_lm(module_lm)
    pool = WorkerPool([Shout(), thinker, lambda text: f"echo {text}"])
    assert [type(w) for w in pool] == [ModuleWorker, ModuleWorker, ToolWorker]
    assert pool.names == ["shout", "chainofthought", "<lambda>"]
    text = 'model_id = [0, 1, 2]\nsubtasks = ["say hi", "think", "repeat"]\naccess_list = [[], [], []]'
    prediction = Conductor(pool, scripted_lm([text]))(question="What is 6 * 7?")
    assert [step.output for step in prediction.trace] == ["SAY HI", "42", "echo repeat"]
    assert "What is 6 * 7?" in module_lm.scripted_engine.prompts[0]  # the module got the step's question


def test_what_cant_be_a_worker_is_refused_clearly():
    with pytest.raises(ConfigError, match="can't be a worker"):
        WorkerPool([42])
    with pytest.raises(ConfigError, match="is a worker already"):
        as_worker(ScriptedWorker("w"), name="other")


class TestDSPyToolWorkerContract(WorkerContract):
    @pytest.fixture
    def worker(self):
        def echo(text: str) -> str:
            return f"you said: {text}"

        return as_worker(dspy.Tool(echo))

    @pytest.fixture
    def prompt_messages(self):
        return [{"role": "user", "content": "one two three four five six seven eight nine ten"}]


class TestModuleWorkerContract(WorkerContract):
    @pytest.fixture
    def worker(self):
        predict = dspy.Predict("question -> answer")
        predict.set_lm(scripted_lm(lambda _: "[[ ## answer ## ]]\nforty two, and more words\n\n[[ ## completed ## ]]"))
        return as_worker(predict, name="predict")

    @pytest.fixture
    def prompt_messages(self):
        return [{"role": "user", "content": "What is 6 * 7?"}]
