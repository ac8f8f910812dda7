"""GRPO with recursive rounds on the tiny random model: a sampled workflow that names the conductor gets a second,
live-sampled completion, the discounted reward, and both completions in the update."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.optimizers.grpo import GRPOTrainer  # noqa: E402
from tests.optimizers.test_grpo_helpers import (  # noqa: E402, F401
    RIGHT,
    _one_torch_thread,
    choice,
    config,
    exact,
    program,
    step_examples,
    tiny,
    trainset,
)

RECURSE = 'D model_id = [0, 2]\nsubtasks = ["Go.", "Check."]\naccess_list = [[], "all"]'
"""Worker 0 (right) answers, then the conductor (Model 2 of the two-worker pool) reviews the answer."""


def recursive_trainer(output_dir: Path) -> GRPOTrainer:
    policy = tiny()
    conductor = program()
    conductor.max_depth = 1
    conductor.revise.signature = conductor.revise.signature.with_instructions("Keep or rewrite.")
    settings = config(output_dir, steps=1, batch_size=1, group_size=6, max_new_tokens=96)
    return GRPOTrainer(
        settings, policy, conductor, trainset(), exact, logits_processor=choice(policy, [RIGHT, RECURSE])
    )


def test_a_recursive_rollout_samples_its_second_round_live_and_is_rewarded_and_trained_on_both(tmp_path: Path) -> None:
    run = recursive_trainer(tmp_path)
    run.setup()
    batch = run.rollouts.collect(step_examples(run, 1), 1)
    recursed = [r for r in batch.rollouts if r.sample.text.startswith("D")]
    single = [r for r in batch.rollouts if r.sample.text.startswith("A")]
    assert recursed and single, f"the seed should sample both workflows, got {[r.sample.text for r in batch.rollouts]}"
    weight = run.config.reward.first_round_weight
    for rollout in recursed:
        _, revision = rollout.samples
        assert "Previous answer:\n4" in run.policy.decode(revision.prompt_ids)
        reward = rollout.reward
        assert reward.first_round == 1.0  # worker 0's answer was right
        assert reward.value == pytest.approx((weight * reward.first_round + reward.final_round) / (1 + weight))
        assert rollout.record()["recursive_rounds"] == [
            {"completion_tokens": len(revision.token_ids), "text": revision.text}
        ]
    assert all(len(r.samples) == 1 and r.reward.value == 1.0 and r.reward.first_round is None for r in single)

    again = recursive_trainer(tmp_path / "again")  # a resumed run samples the recursive rounds alike
    again.setup()
    assert [r.samples for r in again.rollouts.collect(step_examples(again, 1), 1).rollouts] == [
        r.samples for r in batch.rollouts
    ]

    trained = []
    sequence_logprobs = run.policy.sequence_logprobs

    def recording(prompts, completions, **kwargs):
        trained.extend(completions)
        return sequence_logprobs(prompts, completions, **kwargs)

    run.policy.sequence_logprobs = recording
    update = run.update(batch, 1)
    assert all(torch.isfinite(torch.tensor(v)) for v in update.values())
    assert sorted(map(tuple, trained)) == sorted(s.token_ids for r in batch.rollouts for s in r.samples)
