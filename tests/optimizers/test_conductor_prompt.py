"""The conductor's prompt is one thing: the messages its predictor sends the LM at inference are those the warm start
trains on and those GRPO samples from, with and without recursion, in the first round and in a recursive one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import dspy  # noqa: E402
from dspy.utils.callback import BaseCallback  # noqa: E402

from conductor.conductor_lm import ConductorLM, Sample  # noqa: E402
from conductor.modules import Conductor, WorkerPool, Workflow  # noqa: E402
from conductor.modules.workflow import workflow_fields  # noqa: E402
from conductor.optimizers.finetune import training_pairs  # noqa: E402
from conductor.optimizers.grpo import GRPOConfig  # noqa: E402
from conductor.optimizers.grpo._rollouts import RolloutCollector  # noqa: E402
from conductor.testing import ScriptedWorker, scripted_lm  # noqa: E402

QUESTION = "What is 2+2?"
ANSWER = 'model_id = [0]\nsubtasks = ["Add."]\naccess_list = [[]]'
RECURSE = 'model_id = [0, 2]\nsubtasks = ["Add.", "Check."]\naccess_list = [[], "all"]'
"""Worker 0 answers, then the conductor (Model 2 of the two-worker pool) reviews the answer in a recursive round."""
KEEP = "model_id = []\nsubtasks = []\naccess_list = []"
Messages = list[dict[str, Any]]


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs with one torch thread (see tests/conftest.py)."""


class LMCalls(BaseCallback):
    """Records the messages of every call to an LM, as the caller (the predictor) sent them."""

    def __init__(self) -> None:
        self.messages: list[Messages] = []

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.messages.append(inputs["messages"])


class RecordingPolicy:
    """Stands in for the policy in GRPO's rollouts: samples ``completions[0]`` for the batch of first-round prompts,
    then ``completions[1]`` for each recursive round, and records every prompt."""

    def __init__(self, completions: list[str]):
        self.completions = completions
        self.prompts: list[Messages] = []

    def sample(self, prompts: list[Messages], n: int, **_: Any) -> list[list[Sample]]:
        text = self.completions[1 if self.prompts else 0]
        self.prompts += prompts
        return [[Sample(text, (), (), (), "stop") for _ in range(n)] for _ in prompts]


def program(max_depth: int, lm: dspy.LM | None = None) -> Conductor:
    """A conductor over two scripted workers with its own instructions and a demo, which the prompt must carry."""
    pool = WorkerPool([ScriptedWorker("right", lambda _: "4"), ScriptedWorker("wrong", lambda _: "5")])
    conductor = Conductor(pool, lm, max_depth=max_depth)
    conductor.orchestrate.signature = conductor.orchestrate.signature.with_instructions("Write a workflow.")
    demo = {"question": "3+3?", "workers": "Model 0\nModel 1", "available_roles": "solve", "max_steps": 5}
    conductor.orchestrate.demos = [dspy.Example(**demo, **workflow_fields(Workflow.parse(ANSWER)))]
    return conductor


def inference_messages(max_depth: int, completions: list[str]) -> list[Messages]:
    """What the conductor LM is sent, call by call, while the program answers ``QUESTION``."""
    calls = LMCalls()
    with dspy.context(callbacks=[calls]):
        prediction = program(max_depth, scripted_lm(completions))(question=QUESTION)
    assert prediction.error is None and prediction.response == "4"
    return calls.messages


def exact(example: dspy.Example, prediction: dspy.Prediction) -> bool:
    return example.answer == prediction.answer


def grpo_messages(max_depth: int, completions: list[str], output_dir: Path) -> list[Messages]:
    """What GRPO's rollouts sample from for ``QUESTION``: the first round's prompt, then each rollout's recursive
    round's, if any."""
    policy = RecordingPolicy(completions)
    config = GRPOConfig(output_dir=output_dir, batch_size=1, group_size=2, randomise_pool=False, progress=False)
    example = dspy.Example(question=QUESTION, answer="4").with_inputs("question")
    collector = RolloutCollector(policy, program(max_depth), exact, config)  # type: ignore[arg-type]
    rollouts = collector.collect([(0, example)], step=1).rollouts
    assert all(r.reward.value == 1.0 and [s.text for s in r.samples] == completions for r in rollouts)
    return policy.prompts


@pytest.mark.parametrize(("max_depth", "completions"), [(0, [ANSWER]), (1, [RECURSE, KEEP])])
def test_inference_warm_start_and_grpo_prompt_the_conductor_with_the_same_messages(
    max_depth: int, completions: list[str], tmp_path: Path
) -> None:
    sent = inference_messages(max_depth, completions)
    assert len(sent) == len(completions)  # the first round, then the recursive round, if any
    first = sent[0]
    assert "Write a workflow." in first[0]["content"] and "3+3?" in first[1]["content"]
    assert ("Model 2: yourself" in first[-1]["content"]) == (max_depth > 0)
    assert program(max_depth).prompt_messages(QUESTION) == first

    first_round, *revisions = grpo_messages(max_depth, completions, tmp_path)
    assert first_round == first
    assert revisions == sent[1:] * 2  # each of the group's two rollouts had its recursive round, if any
    if max_depth:
        assert "Previous answer:\n4" in sent[1][-1]["content"]

    policy = ConductorLM.tiny(seed=0)
    ((prompt, _),) = training_pairs(
        policy, program(max_depth), [({"question": QUESTION}, Workflow.parse(ANSWER))], 10**6
    )
    assert prompt == policy.encode(first)
