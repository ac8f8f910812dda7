"""The GRPO trainer on the tiny random model with scripted workers: the update's direction, prompts as at inference,
randomised pools, bad inputs, checkpoints and resuming."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import dspy  # noqa: E402

from conductor.conductor_lm import ConductorLM  # noqa: E402
from conductor.errors import ConductorError, ConfigError  # noqa: E402
from conductor.modules import Conductor, WorkerPool  # noqa: E402
from conductor.optimizers.grpo import GRPOTrainer, checkpoints, random_pool  # noqa: E402
from conductor.testing import ScriptedWorker  # noqa: E402
from tests.optimizers.test_grpo_helpers import (  # noqa: E402, F401
    BROKEN,
    RIGHT,
    WRONG,
    Choice,
    _one_torch_thread,
    choice,
    config,
    exact,
    pool,
    program,
    step_examples,
    tiny,
    trainer,
    trainset,
)


def _adapter(policy: ConductorLM) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


# ---- the update ---------------------------------------------------------------------------------------------------


def test_one_update_raises_the_logprob_of_positive_advantage_workflows_and_lowers_the_negative_ones(
    tmp_path: Path,
) -> None:
    policy = tiny()
    run = GRPOTrainer(
        config(tmp_path, batch_size=1, group_size=8),
        policy,
        program(),
        trainset(),
        exact,
        logits_processor=choice(policy, [RIGHT, BROKEN]),
    )
    run.setup()
    batch = run.rollouts.collect(step_examples(run, 1), 1)
    rewards = [r.reward.value for r in batch.rollouts]
    assert set(rewards) == {0.0, 1.0}, f"the seed should sample both workflows, got {rewards}"
    mean = sum(rewards) / len(rewards)

    def logprob(rollout) -> float:
        return policy.sequence_logprobs(list(rollout.sample.prompt_ids), list(rollout.sample.token_ids)).sum().item()

    distinct = list({r.sample.token_ids: r for r in batch.rollouts}.values())
    before = [logprob(r) for r in distinct]
    run.update(batch, 1)
    after = [logprob(r) for r in distinct]
    for rollout, old, new in zip(distinct, before, after, strict=True):
        assert (new > old) == (rollout.reward.value > mean), (rollout.sample.text[:1], old, new)


def test_training_makes_the_right_workflow_more_likely(tmp_path: Path) -> None:
    history = trainer(tmp_path, steps=6, lr=2e-2).run()
    first, last = history[0], history[-1]
    assert last["reward"] > first["reward"] and last["accuracy"] > first["accuracy"]


@pytest.mark.parametrize("split", [{"grad_accumulation": 3}, {"max_sequences_per_pass": 2}])
def test_micro_batches_give_the_same_update(tmp_path: Path, split: dict[str, int]) -> None:
    whole = trainer(tmp_path / "whole", steps=1, max_sequences_per_pass=None)
    parts = trainer(tmp_path / "split", steps=1, **split)
    passes: list[int] = []  # sequences in each pass with a gradient
    scored = parts.policy.sequence_logprobs

    def counted(prompts, completions, **kwargs):
        if kwargs.get("grad"):
            passes.append(len(prompts))
        return scored(prompts, completions, **kwargs)

    parts.policy.sequence_logprobs = counted
    whole.run(), parts.run()
    assert _same(_adapter(whole.policy), _adapter(parts.policy), atol=1e-6)
    assert not _same(_adapter(whole.policy), _adapter(tiny()))
    limit = split.get("max_sequences_per_pass")
    assert (len(passes) == 3) if limit is None else (max(passes) <= limit and len(passes) > 1)


def test_several_updates_per_batch_clip_and_the_kl_term_runs(tmp_path: Path) -> None:
    history = trainer(tmp_path, steps=1, updates_per_batch=3, beta=0.1, lr=5e-2).run()
    assert history[0]["clip_fraction"] > 0 and history[0]["kl"] > 0
    assert all(math.isfinite(history[0][k]) for k in ("loss", "kl", "grad_norm"))


# ---- prompts and pools ------------------------------------------------------------------------------------------


def test_the_policy_trains_on_exactly_the_prompt_it_gets_at_inference(tmp_path: Path) -> None:
    run = trainer(tmp_path)
    run.setup()
    batch = run.rollouts.collect(step_examples(run, 1), 1)
    seen = []
    inference = program()
    inference.orchestrate.lm = run.policy.as_dspy_lm(on_sample=seen.append, max_tokens=8)
    for group in batch.groups:
        example = run.trainset[group[0].example]
        inference(**example.inputs())
        assert seen[-1].prompt_ids == group[0].sample.prompt_ids
    prompt = run.policy.decode(batch.rollouts[0].sample.prompt_ids)
    assert "Write a workflow." in prompt and "Model 0\nModel 1" in prompt


def test_a_random_pool_is_a_shuffled_subset_of_the_real_workers() -> None:
    import random

    workers = WorkerPool([ScriptedWorker(n) for n in "abcde"], fallbacks={"a": ["b", "c"], "d": ["e"]})
    sizes, orders = set(), set()
    for seed in range(40):
        sub = random_pool(workers, random.Random(seed), 2, 4)
        assert 2 <= len(sub) <= 4 and {w.name for w in sub} <= set("abcde")
        assert all(sub[i] is workers[workers.names.index(n)] for i, n in enumerate(sub.names))  # the real objects
        assert all(o in sub.names for others in sub.fallbacks.values() for o in others)
        sizes.add(len(sub))
        orders.add(tuple(sub.names))
    assert sizes == {2, 3, 4} and len(orders) > 20


def test_randomised_pools_show_ids_0_to_k_minus_1_and_run_the_real_workers(tmp_path: Path) -> None:
    workers = WorkerPool([ScriptedWorker(name, lambda _, name=name: name) for name in ("w0", "w1", "w2")])
    run = trainer(tmp_path, workers=workers, randomise_pool=True, min_pool_size=2, max_pool_size=2, steps=1)
    run.setup()
    rollouts = [r for step in (1, 2, 3) for r in run.rollouts.collect(step_examples(run, step), step).rollouts]
    pools = set()
    for rollout in rollouts:
        prompt = run.policy.decode(rollout.sample.prompt_ids)
        assert "Model 0\nModel 1\n" in prompt and "Model 2" not in prompt
        assert len(rollout.workers) == 2
        pools.add(rollout.workers)
        if rollout.sample.text.startswith(("A", "B")):  # a usable workflow for worker 0 or 1 of the subset
            assert rollout.answer == rollout.workers[0 if rollout.sample.text.startswith("A") else 1]
    assert len(pools) > 1  # examples drew different subsets


def test_a_conductor_that_names_workers_samples_each_random_pool_under_its_own_names(tmp_path: Path) -> None:
    # Two pools of one size name different workers: a grammar made for one would let the other write a worker it
    # lacks (as the names-trained compile's GRPO did, before processors were keyed by the names a pool holds).
    workers = WorkerPool([ScriptedWorker(name, lambda _, name=name: name) for name in ("w0", "w1", "w2")])
    conductor = program(workers)
    conductor.worker_ids = "names"
    policy, made = tiny(), []

    def first_name_only(pool_program: Conductor, depth: int) -> Choice:
        made.append(frozenset(pool_program.pool.names))
        first = sorted(pool_program.pool.names)[0]
        return Choice(policy, [f'model_id = ["{first}"]\nsubtasks = ["Go."]\naccess_list = [[]]'])

    settings = config(tmp_path, randomise_pool=True, min_pool_size=2, max_pool_size=2, steps=1)
    run = GRPOTrainer(settings, policy, conductor, trainset(), exact, logits_processor=first_name_only)
    run.setup()
    rollouts = [r for step in range(1, 7) for r in run.rollouts.collect(step_examples(run, step), step).rollouts]
    assert len({frozenset(r.workers) for r in rollouts}) > 1
    for rollout in rollouts:
        assert rollout.error is None and rollout.answer == sorted(rollout.workers)[0]
    assert len(made) == len(set(made))  # one processor per set of names, whatever its order


# ---- bad input ----------------------------------------------------------------------------------------------------


def test_when_no_sample_is_a_workflow_the_step_warns_and_completes_without_nan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = tiny()
    run = GRPOTrainer(config(tmp_path), policy, program(), trainset(), exact, logits_processor=choice(policy, [BROKEN]))
    with caplog.at_level(logging.WARNING):
        history = run.run()
    assert [m["step"] for m in history] == [1, 2]
    for metrics in history:
        assert metrics["reward"] == 0.0 and metrics["format_failure_rate"] == 1.0
        assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
    assert "all format errors" in caplog.text
    assert _same(_adapter(policy), _adapter(tiny()))  # nothing to learn: unchanged


def test_a_metric_that_raises_records_reward_zero_and_the_run_goes_on(tmp_path: Path) -> None:
    def broken(example: dspy.Example, prediction: dspy.Prediction) -> bool:
        raise KeyError("label")

    history = trainer(tmp_path, metric=broken).run()
    assert len(history) == 2
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    executed = [r for r in records if r["reward"]["format_ok"]]
    assert executed and all(r["reward"]["value"] == 0.0 and "KeyError" in r["reward"]["error"] for r in executed)


def test_a_worker_failing_mid_step_gives_recorded_rewards_and_the_run_goes_on(tmp_path: Path) -> None:
    # 2 failures: under the pool's cooldown threshold (3 in 60 s), so the worker stays in service afterwards
    run = trainer(tmp_path, workers=pool(fail_times=2, retries=0))
    history = run.run()
    assert len(history) == 2
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    right = [r for r in records if r["text"] == RIGHT]
    failed = [r for r in right if r["error"] and "execution error" in r["error"]]
    assert len(failed) == 2 and all(r["reward"]["value"] == 0.5 for r in failed)  # ran, but gave no answer
    assert any(r["reward"]["value"] == 1.0 for r in right)  # the worker answered again afterwards
    assert {r["text"] for r in records} == {RIGHT, WRONG, BROKEN}


def test_an_example_the_program_refuses_is_left_out_of_its_step_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = tiny()
    examples = [dspy.Example(question="   ", answer="4").with_inputs("question"), *trainset(1)]
    run = GRPOTrainer(config(tmp_path, steps=1), policy, program(), examples, exact, logits_processor=choice(policy))
    with caplog.at_level(logging.WARNING):
        history = run.run()
    assert history[0]["rollouts"] == 4 and "gives the conductor no prompt" in caplog.text


def test_balance_by_deals_every_batch_one_example_of_each_family_and_covers_each_epoch(tmp_path: Path) -> None:
    families = ["add"] * 6 + ["spell"] * 2 + ["add"] * 2 + ["spell"] * 6  # 8 of each, clustered on purpose
    data = [
        dspy.Example(question=f"Question {i}", answer="4", family=f).with_inputs("question")
        for i, f in enumerate(families)
    ]
    run = GRPOTrainer(config(tmp_path, balance_by="family", steps=16), tiny(), program(), data, exact)
    batches = [step_examples(run, step) for step in range(1, 17)]
    assert all({e.family for _, e in batch} == {"add", "spell"} for batch in batches)
    for epoch in (batches[:8], batches[8:]):
        assert sorted(i for batch in epoch for i, _ in batch) == list(range(16))
    plain = GRPOTrainer(config(tmp_path, steps=16), tiny(), program(), data, exact)
    assert any(len({e.family for _, e in step_examples(plain, s)}) == 1 for s in range(1, 9))  # the default may not


def test_inputs_are_checked_all_at_once(tmp_path: Path) -> None:
    policy = ConductorLM.tiny(seed=0, lora=None)
    unmarked = [dspy.Example(question="q", answer="a")]
    run = GRPOTrainer(
        config(tmp_path, beta=0.1, randomise_pool=True, min_pool_size=5, balance_by="family"),
        policy,
        program(),
        unmarked,
        exact,
    )
    with pytest.raises(ConfigError) as error:
        run.setup()
    message = str(error.value)
    assert "with_inputs" in message and "min_pool_size=5" in message and "beta > 0" in message
    assert "balance_by='family': trainset[0] have no such label" in message


# ---- checkpoints, metrics and resuming ---------------------------------------------------------------------------


def test_a_run_writes_metrics_rollouts_a_reward_curve_checkpoints_and_the_final_policy(tmp_path: Path) -> None:
    run = trainer(tmp_path, steps=3, checkpoint_every=2, keep_checkpoints=1)
    run.run()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for key in ("reward", "format_failure_rate", "accuracy", "loss", "lr", "tokens_per_s", "time_s"):
        assert key in lines[0]
    assert set(lines[0]["time_s"]) == {"sample", "execute", "update"}
    rollouts = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == 3 * 2 * 4
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in checkpoints(tmp_path)] == ["step-00000003"]  # step 2's was removed (keep 1)
    final = ConductorLM.load(tmp_path / "policy")
    assert _same(_adapter(final), _adapter(run.policy))
    assert _same(_adapter(ConductorLM.load(checkpoints(tmp_path)[-1] / "policy")), _adapter(run.policy))


def test_resuming_reproduces_an_uninterrupted_run_exactly(tmp_path: Path) -> None:
    straight = trainer(tmp_path / "straight", steps=4)
    straight.run()
    first = trainer(tmp_path / "stopped", steps=4, checkpoint_every=2)
    first.setup()
    for step in (1, 2, 3):  # step 3 is "in progress" when the run stops: it is lost
        first.train_step(step)
        if step == 2:
            first.save_checkpoint()
    resumed = trainer(tmp_path / "stopped", steps=4, resume=True)
    history = resumed.run()
    assert _same(_adapter(resumed.policy), _adapter(straight.policy))
    assert [m["step"] for m in history] == [1, 2, 3, 4]
    lines = [json.loads(line) for line in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]  # the lost step 3 was logged once, not twice
    rollouts = [json.loads(line)["step"] for line in (tmp_path / "stopped" / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts == sorted(rollouts) and len(rollouts) == 4 * 8


def test_checkpoints_of_an_earlier_run_are_not_overwritten_without_resume(tmp_path: Path) -> None:
    trainer(tmp_path, steps=1).run()
    with pytest.raises(ConductorError, match="resume=True"):
        trainer(tmp_path, steps=1).setup()


@pytest.mark.parametrize("damage", ["truncate state", "edit manifest", "remove state"])
def test_a_corrupt_checkpoint_gives_a_clear_error(tmp_path: Path, damage: str) -> None:
    trainer(tmp_path, steps=1).run()
    folder = checkpoints(tmp_path)[-1]
    if damage == "truncate state":
        state = folder / "trainer.pt"
        state.write_bytes(state.read_bytes()[:100])
    elif damage == "edit manifest":
        (folder / "checkpoint.json").write_text("{not json")
    else:
        (folder / "trainer.pt").unlink()
    with pytest.raises(ConductorError, match=r"step-00000001 is corrupt.*Delete this folder"):
        trainer(tmp_path, steps=2, resume=True).setup()


def test_a_save_killed_half_way_is_ignored_and_cleared(tmp_path: Path) -> None:
    trainer(tmp_path, steps=1).run()
    partial = tmp_path / "checkpoints" / ".step-00000002.abc.partial"
    partial.mkdir()
    (partial / "trainer.pt").write_bytes(b"half")
    run = trainer(tmp_path, steps=2, resume=True)
    run.setup()
    assert run.step == 1
    run.train()
    assert not partial.exists() and [p.name for p in checkpoints(tmp_path)] == ["step-00000001", "step-00000002"]


def _moved(policy: ConductorLM, seed: int = 1) -> ConductorLM:
    """``policy`` with its adapter moved off zero, as a warm start leaves it (the same move for the same seed)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.trainable_parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return policy


@pytest.mark.parametrize(("reference", "kl_at_the_start"), [("start", False), ("base", True)])
def test_the_kl_term_measures_the_policy_against_its_reference(tmp_path: Path, reference, kl_at_the_start) -> None:
    # One update per batch: its KL is measured before the update moves the policy. Against the weights the run
    # started from it is 0; against the base model, the warm start's whole move away from it.
    run = trainer(tmp_path, steps=1, beta=0.1, reference=reference)
    _moved(run.policy)
    history = run.run()
    assert (history[0]["kl"] > 1e-6) == kl_at_the_start
    assert math.isfinite(history[0]["loss"])


def test_a_resumed_run_keeps_the_weights_it_started_from_as_its_reference(tmp_path: Path) -> None:
    # Step 1 moves the policy; the resumed run starts from step 1's checkpoint, yet step 2's KL is against the
    # warm start (the policy as loaded, before the checkpoint is read), so it is not 0 as it would be against step 1.
    first = trainer(tmp_path, steps=1, beta=0.1, reference="start", lr=5e-2)
    _moved(first.policy)
    first.run()
    resumed = trainer(tmp_path, steps=2, beta=0.1, reference="start", lr=5e-2, resume=True)
    _moved(resumed.policy)
    history = resumed.run()
    assert len(history) == 2 and history[0]["kl"] < 1e-6 < history[1]["kl"]
