"""Expert iteration on the tiny policy: sample workflows, keep the ones that scored, balanced per label, and warm-start
on them; labels that never scored are named and left out, and nothing scored means nothing trained."""

from __future__ import annotations

import logging
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import dspy  # noqa: E402

from conductor.errors import ConductorError  # noqa: E402
from conductor.optimizers import ExpertIterationConfig, WarmStartConfig, expert_iteration  # noqa: E402
from conductor.optimizers._expert_iteration import _spread_over_questions  # noqa: E402
from conductor.optimizers.finetune import completion_nll, training_pairs  # noqa: E402
from tests.optimizers.test_grpo_helpers import (  # noqa: E402, F401
    BROKEN,
    RIGHT,
    WRONG,
    Choice,
    _one_torch_thread,
    exact,
    program,
    tiny,
)

TEXTS = [RIGHT, WRONG, BROKEN]
"""Worker 0 answers 4, worker 1 answers 5, the third is a format error (see ``test_grpo_helpers``)."""
WORKER = {"4": "A", "5": "B"}
"""The first token of the workflow that answers each answer right."""


def examples(answers: dict[str, str], n: int = 2) -> list[dspy.Example]:
    """``n`` questions per family, each family right with one answer."""
    return [
        dspy.Example(question=f"{family} question {i}", answer=answer, family=family).with_inputs("question")
        for family, answer in answers.items()
        for i in range(n)
    ]


def config(**overrides) -> ExpertIterationConfig:
    settings = {
        "samples": 8,
        "balance_by": "family",
        "per_label": 3,
        "max_new_tokens": 64,
        "warm_start": WarmStartConfig(steps=4, lr=1e-2),
    }
    return ExpertIterationConfig(**(settings | overrides))


def first_tokens(trainset: list[dspy.Example], samples: int) -> list[list[str]]:
    """What a fresh tiny policy samples first for each question, under the same seed and processor."""
    policy, conductor = tiny(), program()
    prompts = [conductor.prompt_messages(e.question) for e in trainset]
    rows = policy.sample(prompts, samples, max_new_tokens=64, seed=0, logits_processor=Choice(policy, TEXTS))
    return [[s.text[0] for s in row] for row in rows]


def test_the_workflows_that_scored_are_kept_per_family_and_trained_on() -> None:
    trainset = examples({"x": "4", "y": "5"})
    policy, conductor = tiny(), program()
    report = expert_iteration(policy, conductor, trainset, exact, config(), logits_processor=Choice(policy, TEXTS))

    sampled = first_tokens(trainset, 8)
    for family, answer in (("x", "4"), ("y", "5")):
        rows = [row for e, row in zip(trainset, sampled, strict=True) if e.family == family]
        assert report.right[family] == sum(t == WORKER[answer] for row in rows for t in row) / 16
        assert report.kept[family] == sum(WORKER[answer] in row for row in rows)  # one right workflow per question
    assert 0 < report.right["x"] < 1 and 0 < report.right["y"] < 1  # a choice to learn, on both families
    assert report.warm_start is not None and report.warm_start.examples == 3 + 3

    # what was trained on: each family's right workflow, now likelier than before
    right_workflow = {"4": conductor.read_completion(RIGHT).workflow, "5": conductor.read_completion(WRONG).workflow}
    pairs = [({"question": e.question}, right_workflow[e.answer]) for e in trainset]
    tokens = training_pairs(policy, conductor, pairs, max_length=4096)
    fresh = tiny()
    assert completion_nll(policy, tokens).item() < completion_nll(fresh, tokens).item()


def test_a_family_that_never_scored_is_named_and_left_out(caplog: pytest.LogCaptureFixture) -> None:
    trainset = examples({"x": "4", "z": "6"})  # no worker answers 6
    policy, conductor = tiny(), program()
    with caplog.at_level(logging.WARNING, logger="conductor.optimizers._expert_iteration"):
        report = expert_iteration(policy, conductor, trainset, exact, config(), logits_processor=Choice(policy, TEXTS))
    assert report.right["z"] == 0 and report.kept["z"] == 0
    assert "no sampled workflow was kept for z" in caplog.text
    assert report.warm_start is not None and report.warm_start.examples == 3  # x's alone


def test_without_balance_every_kept_workflow_counts_once() -> None:
    trainset = examples({"x": "4", "y": "5"})
    policy, conductor = tiny(), program()
    report = expert_iteration(
        policy, conductor, trainset, exact, config(balance_by=None), logits_processor=Choice(policy, TEXTS)
    )
    assert set(report.right) == set(report.kept) == {"all"}
    assert report.warm_start is not None and report.warm_start.examples == report.kept["all"]


def test_nothing_scored_trains_nothing() -> None:
    trainset = examples({"z": "6"})
    policy, conductor = tiny(), program()
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    report = expert_iteration(policy, conductor, trainset, exact, config(), logits_processor=Choice(policy, TEXTS))
    assert report.warm_start is None and report.kept == {"z": 0}
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters(), strict=True))


def test_no_training_questions_is_a_clear_error() -> None:
    policy, conductor = tiny(), program()
    with pytest.raises(ConductorError, match="at least one training question"):
        expert_iteration(policy, conductor, [], exact, config(), logits_processor=Choice(policy, TEXTS))


def test_above_base_rate_keeps_a_workflow_that_beats_its_family_and_drops_chance_successes() -> None:
    # family x: worker 0 is right on every question; family "coin": its first question wants 4, its second 5, so
    # each workflow is right on half of them: no better than the family's samples as a whole
    trainset = [
        *examples({"x": "4"}),
        dspy.Example(question="coin question 0", answer="4", family="coin").with_inputs("question"),
        dspy.Example(question="coin question 1", answer="5", family="coin").with_inputs("question"),
    ]
    settings = {"samples": 16, "per_label": 2}
    policy = tiny()
    earned = expert_iteration(
        policy, program(), trainset, exact, config(**settings), logits_processor=Choice(policy, TEXTS)
    )
    assert earned.kept["coin"] == 2  # each coin question's right workflow, kept as every success is
    policy = tiny()
    above = expert_iteration(
        policy,
        program(),
        trainset,
        exact,
        config(**settings, keep="above_base_rate"),
        logits_processor=Choice(policy, TEXTS),
    )
    assert above.right == earned.right  # the same samples, only the keep rule differs
    assert above.kept == {"x": 2, "coin": 0}
    assert above.warm_start is not None and above.warm_start.examples == 2


def test_a_labels_share_is_spread_over_its_questions_not_its_first_questions_many_workflows() -> None:
    many = [({"question": "first"}, f"workflow {i}") for i in range(10)]
    few = [({"question": "second"}, "workflow a"), ({"question": "third"}, "workflow b")]
    chosen = _spread_over_questions([*many, *few], 4, random.Random(0))
    assert [q["question"] for q, _ in chosen] == ["first", "second", "third", "first"]
    assert len({w for _, w in chosen}) == 4  # two different workflows of the first question
    # fewer kept than the share: cycled, every one of them used
    assert _spread_over_questions(few, 3, random.Random(0)) == [few[0], few[1], few[0]]
