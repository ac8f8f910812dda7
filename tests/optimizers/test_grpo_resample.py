"""GRPO's ``resample_agreeing`` (DAPO's dynamic sampling) on the tiny random model with scripted workers: groups whose
rewards all agree are replaced by groups of the next questions in the epoch order, up to a number of rounds, and the
step's metrics count what that cost; a resumed run draws the same questions."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import dspy  # noqa: E402

from conductor.optimizers.grpo import GRPOTrainer  # noqa: E402
from tests.optimizers.test_grpo_helpers import (  # noqa: E402, F401
    RIGHT,
    WRONG,
    _one_torch_thread,
    choice,
    config,
    exact,
    program,
    tiny,
    trainset,
)


def run_with_unanswerable(output_dir: Path, places: Iterable[int], **overrides: Any) -> GRPOTrainer:
    """A run over 8 questions whose policy chooses between the right and the wrong worker; the questions at
    ``places`` of the epoch order can't be answered (no worker says "none"), so every workflow earns 0.5 on them and
    their groups agree."""
    unanswerable: set[str] = set()

    def metric(example: dspy.Example, prediction: dspy.Prediction) -> bool:
        return example.question not in unanswerable and exact(example, prediction)

    policy = tiny()
    run = GRPOTrainer(
        config(output_dir, **overrides),
        policy,
        program(),
        trainset(8),
        metric,
        logits_processor=choice(policy, [RIGHT, WRONG]),
    )
    unanswerable.update(example.question for place in places for _, example in run.examples_at(place, 1))
    return run


def _places(run: GRPOTrainer, first: int, count: int) -> list[int]:
    """The trainset indices at ``count`` places of the epoch order from ``first``."""
    return [index for index, _ in run.examples_at(first, count)]


def _adapter(run: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in run.policy.model.named_parameters() if p.requires_grad}


def _changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def _rollouts(output_dir: Path, step: int) -> list[dict[str, Any]]:
    lines = (output_dir / "rollouts.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["step"] == step]


def _groups(records: list[dict[str, Any]], *, dropped: bool) -> list[int]:
    """The example of each group (of 4 rollouts) among ``records`` trained on, or dropped."""
    examples = [r["example"] for r in records if r["dropped"] == dropped]
    return examples[::4]


def test_a_step_whose_groups_agree_trains_on_groups_of_the_next_questions_that_disagree(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = run_with_unanswerable(tmp_path, places=[0, 1], steps=1, resample_agreeing=2, progress=True)
    run.setup()
    untrained = _adapter(run)
    metrics = run.train_step(1)
    run.cleanup()

    records = _rollouts(tmp_path, 1)
    assert _groups(records, dropped=True) == _places(run, 0, 2)  # the batch drawn first: every reward 0.5
    assert _groups(records, dropped=False) == _places(run, 2, 2), "the seed should sample both workflows for these"
    trained = [r["reward"]["value"] for r in records if not r["dropped"]]
    assert len(set(trained[:4])) > 1 and len(set(trained[4:])) > 1
    assert metrics.grad_norm > 0 and _changed(_adapter(run), untrained)
    assert (metrics.agreeing_groups, metrics.resampled_groups, metrics.rollouts) == (2, 2, 16)
    assert metrics.reward == pytest.approx(sum(r["reward"]["value"] for r in records) / 16)  # over all it ran
    assert run.drawn == 4  # the next step goes on after the replacements
    assert "agreeing=2" in capsys.readouterr().err.replace(" ", "")


def test_the_rounds_are_capped_and_the_last_round_is_what_the_update_gets(tmp_path: Path) -> None:
    run = run_with_unanswerable(tmp_path, places=range(8), steps=2, resample_agreeing=2)
    untrained = _adapter(run)
    history = run.run()

    step1, step2 = _rollouts(tmp_path, 1), _rollouts(tmp_path, 2)
    assert _groups(step1, dropped=True) == _places(run, 0, 4)  # two rounds, then the cap
    assert _groups(step1, dropped=False) == _places(run, 4, 2)  # the last round's groups: all that is there
    assert _groups(step2, dropped=True) + _groups(step2, dropped=False) == _places(run, 6, 6)  # into epoch 2
    for metrics in history:
        assert (metrics["agreeing_groups"], metrics["resampled_groups"], metrics["rollouts"]) == (6, 4, 24)
        assert metrics["grad_norm"] == 0
    assert not _changed(_adapter(run), untrained)  # every group agreed: nothing to learn
    assert run.drawn == 12


def test_a_step_whose_groups_all_agree_leaves_the_weights_as_the_step_before_left_them(tmp_path: Path) -> None:
    """An optimizer step on zero gradients would move them along AdamW's momentum from step 1's update."""
    run = run_with_unanswerable(tmp_path, places=[2, 3], steps=2)  # step 2's two questions
    run.setup()
    untrained = _adapter(run)
    run.train_step(1)
    learned = _adapter(run)
    assert run.log.history[0]["grad_norm"] > 0 and _changed(learned, untrained)
    run.train_step(2)
    assert (run.log.history[1]["agreeing_groups"], run.log.history[1]["grad_norm"]) == (2, 0)
    assert not _changed(_adapter(run), learned)
    assert run.scheduler.last_epoch == 1  # the schedule counts optimizer steps: step 2 took none


def test_by_default_a_step_trains_on_its_batch_as_drawn(tmp_path: Path) -> None:
    run = run_with_unanswerable(tmp_path, places=range(8), steps=2)
    history = run.run()
    for step, metrics in enumerate(history, 1):
        records = _rollouts(tmp_path, step)
        assert _groups(records, dropped=False) == _places(run, 2 * (step - 1), 2)
        assert not _groups(records, dropped=True)
        assert (metrics["agreeing_groups"], metrics["resampled_groups"], metrics["rollouts"]) == (2, 0, 8)


def test_resuming_a_run_that_resamples_draws_the_same_questions_and_trains_the_same_adapter(tmp_path: Path) -> None:
    settings = {"places": [0, 2, 3, 5], "steps": 4, "resample_agreeing": 1}
    straight = run_with_unanswerable(tmp_path / "straight", **settings)
    straight.run()
    stopped = run_with_unanswerable(tmp_path / "stopped", **settings)
    stopped.setup()
    for step in (1, 2, 3):  # step 3 is "in progress" when the run stops: it is lost
        stopped.train_step(step)
        if step == 2:
            stopped.save_checkpoint()
    assert sum(m["resampled_groups"] for m in stopped.log.history[:2]) > 0  # the checkpoint's steps drew extra
    resumed = run_with_unanswerable(tmp_path / "stopped", resume=True, **settings)
    history = resumed.run()

    assert not _changed(_adapter(resumed), _adapter(straight))
    same = ("reward", "agreeing_groups", "resampled_groups", "rollouts", "loss", "grad_norm")
    assert [{k: m[k] for k in same} for m in history] == [{k: m[k] for k in same} for m in straight.log.history]
    read = [(tmp_path / run / "rollouts.jsonl").read_text() for run in ("straight", "stopped")]
    assert read[0] == read[1]
