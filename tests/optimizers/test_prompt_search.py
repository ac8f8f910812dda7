"""WorkflowFewShot and PromptSearch on scripted conductors and workers: each optimizer runs, changes what it should,
keeps the best candidate by validation score, and refuses bad input clearly."""

import json
import re
import sys

import dspy
import pytest

from conductor.errors import ConductorError, ConfigError, MissingDependency
from conductor.modules import Completion, Conductor, WorkerPool
from conductor.optimizers import PromptSearch, WorkflowFewShot, WorkflowMetric
from conductor.testing import ScriptedWorker, scripted_lm


def workflow(worker: int, subtask: str) -> str:
    return f'model_id = [{worker}]\nsubtasks = ["{subtask}"]\naccess_list = [[]]'


GOOD = workflow(1, "compute it exactly")  # worker 1 answers right
BAD = workflow(0, "guess")  # worker 0 answers wrong
GOOD_DEMO = 'subtasks = ["compute it exactly"]'  # how a GOOD demo shows in the conductor's prompt


def question_of(prompt: str) -> str:
    return re.findall(r"Question:\n(.*)", prompt)[-1]  # demos come first; the last question is the one asked


def make_pool() -> WorkerPool:
    def guesser(prompt: str) -> str:
        return "Answer: 42" if "garbled" in prompt else "Answer: 0"

    return WorkerPool([ScriptedWorker("guesser", guesser), ScriptedWorker("solver", lambda _: "Answer: 42")])


def examples(*questions: str) -> list[dspy.Example]:
    return [dspy.Example(question=q, answer="42").with_inputs("question") for q in questions]


def exact(example, prediction) -> float:
    return float(prediction.answer == example.answer)


def few_shot_conductor(*, demos_help: bool = True):
    """``easy`` questions get a right workflow, ``wrong`` ones a wrong one, ``garbled`` ones an unusable one (the
    fallback, worker 0, then answers right); ``hard`` ones a right workflow only when a GOOD demo is in the prompt
    (or only when none is, with ``demos_help=False``)."""
    prompts: list[str] = []

    def conductor(prompt: str) -> str:
        prompts.append(prompt)
        question = question_of(prompt)
        if question.startswith("easy"):
            return GOOD
        if question.startswith("wrong"):
            return workflow(0, "the wrong way")
        if question.startswith("garbled"):
            return workflow(7, "no such worker")  # parses, but fails validation
        return GOOD if (GOOD_DEMO in prompt) == demos_help else BAD

    return scripted_lm(conductor), prompts


TRAIN = examples("easy 0", "wrong 0", "garbled 0", "easy 1", "wrong 1")
VAL = examples("hard 0", "hard 1", "hard 2")


# ---- WorkflowFewShot ----------------------------------------------------------------------------------------------
def test_few_shot_keeps_only_workflows_that_scored_1_and_they_reach_the_conductor_prompt():
    lm, prompts = few_shot_conductor()
    student = Conductor(make_pool(), lm)
    compiled = WorkflowFewShot(exact, num_candidates=2).compile(student, trainset=TRAIN, valset=VAL)

    demos = compiled.orchestrate.demos
    assert demos, "the right training workflows should have become demos"
    every_set = [d for candidate in compiled.candidate_programs for d in candidate["program"].orchestrate.demos]
    assert {d["question"] for d in every_set} == {"easy 0", "easy 1"}  # not the wrong runs, not the fallback's answer
    for demo in demos:
        assert demo["model_id"] == [1] and demo["subtasks"] == ["compute it exactly"] and demo["access_list"] == [[]]
        assert demo["workers"] == "Model 0\nModel 1" and demo["max_steps"] == 5 and "solve" in demo["available_roles"]
    assert student.orchestrate.demos == []  # the student is not touched
    assert compiled.orchestrate.lm is lm

    prompts.clear()
    prediction = compiled(question="hard 9")
    assert GOOD_DEMO in prompts[0] and prediction.answer == "42"


def test_few_shot_keeps_the_demo_set_with_the_best_validation_score():
    lm, _ = few_shot_conductor(demos_help=True)
    compiled = WorkflowFewShot(exact, num_candidates=2).compile(Conductor(make_pool(), lm), trainset=TRAIN, valset=VAL)
    scores = {c["seed"]: c["score"] for c in compiled.candidate_programs}
    assert scores[-3] == 0.0 and max(scores.values()) == 100.0  # the baseline fails validation, the demos pass it
    assert compiled.orchestrate.demos


def test_few_shot_keeps_the_baseline_when_demos_hurt_on_validation():
    lm, _ = few_shot_conductor(demos_help=False)
    compiled = WorkflowFewShot(exact, num_candidates=2).compile(Conductor(make_pool(), lm), trainset=TRAIN, valset=VAL)
    assert compiled.orchestrate.demos == []
    assert compiled.candidate_programs[0]["seed"] == -3 and compiled.candidate_programs[0]["score"] == 100.0
    assert compiled(question="hard 9").answer == "42"


def test_few_shot_can_search_a_compiled_program_again():
    lm, _ = few_shot_conductor()
    optimizer = WorkflowFewShot(exact, num_candidates=1)
    once = optimizer.compile(Conductor(make_pool(), lm), trainset=TRAIN, valset=VAL)
    twice = optimizer.compile(once, trainset=TRAIN, valset=VAL)
    assert twice.orchestrate.demos and twice.orchestrate.lm is lm


def raising_metric(example, prediction):
    raise KeyError("gold")


@pytest.mark.parametrize(
    "student, trainset, valset, metric, error, message",
    [
        ("conductor", [], None, exact, ConfigError, "the trainset is empty"),
        ("conductor", TRAIN, [], exact, ConfigError, "the valset is empty"),
        ("conductor", TRAIN, VAL, raising_metric, ConductorError, "the metric raised on the first example"),
        ("module", TRAIN, VAL, exact, ConfigError, "must be a Conductor"),
    ],
)
def test_few_shot_refuses_bad_input_before_searching(student, trainset, valset, metric, error, message):
    lm, prompts = few_shot_conductor()
    program = Conductor(make_pool(), lm) if student == "conductor" else dspy.Predict("question -> answer")
    with pytest.raises(error, match=message):
        WorkflowFewShot(metric).compile(program, trainset=trainset, valset=valset)
    assert len(prompts) <= 1  # at most the one run that tried the metric
    if student == "conductor":
        assert program.orchestrate.demos == []


def test_workflow_metric_accepts_a_demo_only_when_the_conductors_own_workflow_scored_enough():
    lm, _ = few_shot_conductor()
    program = Conductor(make_pool(), lm)
    metric = WorkflowMetric(exact)
    right, wrong, fallback = (program(question=q) for q in ("easy 0", "wrong 0", "garbled 0"))
    [example] = examples("q")
    assert fallback.answer == "42" and fallback.error.kind == "format"
    assert [metric(example, p) for p in (right, wrong, fallback)] == [1.0, 0.0, 1.0]  # evaluating: the answer
    assert [metric(example, p, trace=[]) for p in (right, wrong, fallback)] == [1.0, 0.0, 0.0]  # bootstrapping
    assert WorkflowMetric(raising_metric)(example, right) == 0.0


# ---- PromptSearch -------------------------------------------------------------------------------------------------
GOOD_INSTRUCTION = "PREFER MODEL 1 and be CAREFUL."


def prompt_model(instructions: list[str]) -> dspy.LM:
    """A proposer LM that fills whatever output fields DSPy asks for (chat markers or JSON); proposed instructions
    come from ``instructions`` in turn."""
    proposals = iter(instructions * 100)

    def respond(prompt: str) -> str:
        if "Your output fields are:" not in prompt:  # dspy 3.4.0's GEPA asks with the gepa library's own prompt
            return f"```\n{next(proposals)}\n```"
        block = prompt.split("Your output fields are:")[1].split("\n\n")[0]
        names = re.findall(r"\d+\. `(\w+)`", block)
        values = {n: next(proposals) if "instruction" in n else f"some {n}" for n in names}
        if "JSON object" in prompt:
            return json.dumps(values)
        return "\n\n".join([*(f"[[ ## {n} ## ]]\n{v}" for n, v in values.items()), "[[ ## completed ## ]]"])

    return scripted_lm(respond, "scripted/proposer")


def instruction_conductor():
    """Writes the right workflow only when its instructions say so."""
    return scripted_lm(lambda prompt: GOOD if "PREFER MODEL 1" in prompt else BAD)


def test_mipro_searches_the_conductor_instructions_and_keeps_the_best_on_validation():
    lm = instruction_conductor()
    student = Conductor(make_pool(), lm)
    proposer = prompt_model(["Be brief.", GOOD_INSTRUCTION, "Think first."])
    search = PromptSearch(exact, prompt_model=proposer, max_bootstrapped_demos=0, num_threads=1, seed=0)
    compiled = search.compile(student, trainset=examples("hard 0", "hard 1"), valset=VAL)
    assert "PREFER MODEL 1" in compiled.orchestrate.signature.instructions
    assert "PREFER MODEL 1" not in student.orchestrate.signature.instructions
    assert compiled.score == 100.0 and compiled.orchestrate.lm is lm
    assert compiled(question="hard 9").answer == "42"


def test_mipro_searches_the_worker_role_instructions():
    class CarefulWorker(ScriptedWorker):
        """Answers right only when its role's instructions (the system message) say CAREFUL."""

        def complete(self, messages, *, max_tokens, temperature):
            done = super().complete(messages, max_tokens=max_tokens, temperature=temperature)
            answer = "Answer: 42" if "CAREFUL" in messages[0]["content"] else "Answer: 0"
            return Completion(answer, done.input_tokens, 2)

    student = Conductor(WorkerPool([CarefulWorker("solver")]), scripted_lm(lambda _: workflow(0, "solve it")))
    proposer = prompt_model(["Be brief.", GOOD_INSTRUCTION])
    search = PromptSearch(exact, prompt_model=proposer, max_bootstrapped_demos=0, num_threads=1, seed=0)
    compiled = search.compile(student, trainset=examples("hard 0", "hard 1"), valset=VAL)
    assert "CAREFUL" in compiled.roles["solve"].signature.instructions
    assert compiled(question="hard 9").answer == "42"


def test_gepa_rewrites_the_conductor_instructions_when_a_reflection_lm_is_given():
    lm = instruction_conductor()
    student = Conductor(make_pool(), lm)
    reflection = prompt_model([GOOD_INSTRUCTION])
    search = PromptSearch(exact, reflection_lm=reflection, auto=None, max_metric_calls=30, num_threads=1)
    compiled = search.compile(student, trainset=examples("hard 0", "hard 1", "hard 2"), valset=VAL)
    assert compiled.orchestrate.signature.instructions == GOOD_INSTRUCTION
    assert compiled.orchestrate.lm is lm and compiled(question="hard 9").answer == "42"


def test_prompt_search_refuses_an_empty_trainset_and_a_raising_metric():
    proposer = prompt_model(["x"])
    with pytest.raises(ConfigError, match="the trainset is empty"):
        PromptSearch(exact, prompt_model=proposer).compile(Conductor(make_pool(), instruction_conductor()), trainset=[])
    with pytest.raises(ConductorError, match="the metric raised on the first example"):
        PromptSearch(raising_metric, prompt_model=proposer).compile(
            Conductor(make_pool(), instruction_conductor()), trainset=examples("hard 0", "hard 1")
        )


def test_mipro_without_optuna_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    search = PromptSearch(exact, prompt_model=prompt_model(["x"]))
    with pytest.raises(MissingDependency, match=r"pip install 'dspy-conductor\[tune\]'"):
        search.compile(Conductor(make_pool(), instruction_conductor()), trainset=examples("hard 0", "hard 1"))
