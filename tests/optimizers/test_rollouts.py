"""The rollout loop's run-and-score half on its own (``run_and_score``): given workflows, as text or ``Workflow``, run
over the pool in threads and scored, in the jobs' order; no fallback in a rollout program; no torch needed."""

from __future__ import annotations

import dspy

from conductor.modules import Conductor, Usage, WorkerPool, Workflow
from conductor.optimizers import RewardConfig, RolloutJob, rollout_program, run_and_score
from conductor.testing import ScriptedWorker

RIGHT = 'model_id = [0]\nsubtasks = ["Add."]\naccess_list = [[]]'
"""Worker 0 answers 4 (right); worker 1 answers 5 (wrong)."""


def program() -> Conductor:
    return Conductor(WorkerPool([ScriptedWorker("right", lambda _: "4"), ScriptedWorker("wrong", lambda _: "5")]))


def example(question: str = "What is 2+2?") -> dspy.Example:
    return dspy.Example(question=question, answer="4").with_inputs("question")


def exact(example: dspy.Example, prediction: dspy.Prediction) -> bool:
    return example.answer == prediction.answer


def test_texts_and_workflows_are_run_and_scored_in_the_jobs_order() -> None:
    runner = rollout_program(program())
    jobs = [
        RolloutJob(example(), RIGHT),
        RolloutJob(example(), Workflow.from_lists([1], ["Add."], [[]])),
        RolloutJob(example(), "not a workflow"),
        RolloutJob(example(), Workflow.from_lists([0, 1], ["Add.", "Check."], [[], "all"])),
    ]
    runs = run_and_score(runner, jobs, exact, threads=3)
    assert [run.reward.value for run in runs] == [1.0, 0.5, 0.0, 0.5]
    assert [run.prediction.response for run in runs] == ["4", "5", None, "5"]
    assert runs[2].prediction.error.kind == "format"  # no fallback answered for the unusable text
    assert [run.earned(1.0) for run in runs] == [True, False, False, False]
    assert runs[1].prediction.workflow == Workflow.from_lists([1], ["Add."], [[]])


def test_the_reward_config_a_job_program_and_question_and_the_conductors_usage_are_used() -> None:
    other = rollout_program(program(), program().pool.subset([1, 0]))  # Model 0 is now the wrong worker
    jobs = [
        RolloutJob(example(), RIGHT, program=other),
        RolloutJob(example("ignored"), RIGHT, question="What is 2+2?"),
        RolloutJob(example(), RIGHT, usage=Usage(7, 3)),
    ]
    runs = run_and_score(rollout_program(program()), jobs, exact, RewardConfig(wrong=0.0))
    assert [run.reward.value for run in runs] == [0.0, 1.0, 1.0]
    assert runs[2].prediction.tokens == runs[1].prediction.tokens + 10  # the conductor's own tokens count


def test_an_example_that_gives_no_question_gets_the_programs_no_answer() -> None:
    (run,) = run_and_score(program(), [RolloutJob(dspy.Example(answer="4").with_inputs(), RIGHT)], exact)
    assert run.prediction.error.kind == "input" and run.prediction.response is None
    assert run.reward.format_ok and run.reward.value == 0.5
