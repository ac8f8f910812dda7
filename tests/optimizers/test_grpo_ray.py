"""GRPO rollouts in Ray actors on a local cluster: two actors train the very adapter that one process trains under
the same seeds (groups that agree resampled alike), and a run whose actor is killed mid-step ends the same (the actor
restarts and redoes its shard)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
ray = pytest.importorskip("ray")

from conductor.errors import ConductorError  # noqa: E402
from conductor.local import trainable_policy  # noqa: E402
from conductor.optimizers.grpo import GRPOTrainer, RolloutSetup  # noqa: E402
from conductor.optimizers.grpo._actors import RolloutActor, prompt_state  # noqa: E402
from tests.optimizers.test_grpo_helpers import (  # noqa: E402, F401
    _one_torch_thread,
    choice,
    config,
    exact,
    program,
    tiny,
    trainset,
)

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("local_cluster")]  # one cluster at a time

RUN = {
    "steps": 3,
    "batch_size": 4,
    "rollout_workers": 2,
    "randomise_pool": True,
    "checkpoint_every": 2,
    "group_size": 3,  # small groups agree now and then: every step resamples, step 3 over both actors
    "resample_agreeing": 1,
}


def setup() -> RolloutSetup:
    """What each rollout actor builds: the tests' tiny policy, program, metric and workflow choice."""
    policy = tiny()
    return RolloutSetup(policy, program(), exact, choice(policy))


def _trainer(output_dir: Path, **overrides: Any) -> GRPOTrainer:
    """The run under test; its actors' ``setup`` is named by this module's importable name (pytest imports it as
    plain ``test_grpo_ray``, which Ray's workers can't import)."""
    policy = tiny()
    return GRPOTrainer(
        config(output_dir, **RUN | overrides),
        policy,
        program(),
        trainset(),
        exact,
        logits_processor=choice(policy),
        rollout_setup=importlib.import_module("tests.optimizers.test_grpo_ray").setup,
    )


def _adapter(run: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in run.policy.model.named_parameters() if p.requires_grad}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _rewards(history: list[dict[str, Any]]) -> list[float]:
    return [step["reward"] for step in history]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> GRPOTrainer:
    """The reference: the same run, its two shards sampled one after the other in this process, on one torch thread
    as the actors and the tests' own updates run (a module fixture starts before the function-scoped
    ``one_torch_thread``, and sums split over two threads round differently in the last bit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = _trainer(tmp_path_factory.mktemp("in-process"))
        run.run()
    finally:
        torch.set_num_threads(threads)
    return run


def test_two_rollout_actors_train_the_same_adapter_as_one_process(tmp_path: Path, in_process: GRPOTrainer) -> None:
    on_ray = _trainer(tmp_path, ray="local")
    history = on_ray.run()
    assert _same(_adapter(on_ray), _adapter(in_process))
    assert not _same(_adapter(on_ray), _adapter(_trainer(tmp_path / "untrained")))  # it did learn something
    assert _rewards(history) == _rewards(in_process.log.history)
    assert all(step["resampled_groups"] for step in history)  # the replacements were sampled alike too


def test_a_killed_actor_is_restarted_and_the_run_ends_the_same(tmp_path: Path, in_process: GRPOTrainer) -> None:
    run = _trainer(tmp_path, ray="local")
    run.setup()
    actors, real_get = list(run.rollouts.actors), run.rollouts.ray.get
    killed = []

    def get_after_a_kill(refs: Any) -> Any:
        """At step 2, kill the first actor while its shard is in flight; Ray restarts it and reruns the shard."""
        if run.step == 1 and not killed:
            ray.kill(actors[0], no_restart=False)
            killed.append(actors[0])
        return real_get(refs)

    run.rollouts.ray = SimpleNamespace(get=get_after_a_kill, put=ray.put, kill=ray.kill)
    try:
        run.train()
    finally:
        run.rollouts.ray = ray
        run.cleanup()
    assert killed
    assert _same(_adapter(run), _adapter(in_process))


@pytest.mark.slow  # another two actors' start: about 40 s here
def test_a_run_on_ray_resumes_from_its_checkpoint_to_the_same_adapter(tmp_path: Path, in_process: GRPOTrainer) -> None:
    stopped = _trainer(tmp_path, ray="local")
    stopped.setup()
    try:
        for step in (1, 2):
            stopped.train_step(step)
        stopped.save_checkpoint()  # a run stopped after step 2's checkpoint
    finally:
        stopped.cleanup()
    resumed = _trainer(tmp_path, ray="local", resume=True)
    resumed.run()
    assert resumed.log.history[0]["step"] == 1 and len(resumed.log.history) == 3
    assert _same(_adapter(resumed), _adapter(in_process))


def test_ray_without_a_rollout_setup_is_refused(tmp_path: Path) -> None:
    from conductor.errors import ConfigError

    policy = tiny()
    run = GRPOTrainer(config(tmp_path, ray="local"), policy, program(), trainset(), exact)
    with pytest.raises(ConfigError, match="need rollout_setup"):
        run.setup()


def with_policy_as_conductor_lm() -> RolloutSetup:
    """As ``conductor compile`` builds an actor's program: the policy is the conductor LM, a ``dspy.LM`` whose engine
    is a local model's."""
    policy = tiny()
    conductor = program()
    conductor.orchestrate.lm = policy.as_dspy_lm()
    return RolloutSetup(policy, conductor, exact, choice(policy))


def test_an_actor_takes_the_driver_s_prompts_and_keeps_its_own_conductor_lm(tmp_path: Path) -> None:
    driver = with_policy_as_conductor_lm().program
    driver.orchestrate.signature = driver.orchestrate.signature.with_instructions("Write the best workflow.")
    state = prompt_state(driver)
    with pytest.raises(ConductorError, match="never saved"):
        driver.dump_state()  # a policy's LM can't be dumped before the policy is saved...
    trainable_policy(driver.orchestrate.lm).save(tmp_path / "policy")
    with pytest.raises(ValueError, match="custom serialized engine"):  # ...nor, once saved, rebuilt from state
        RolloutActor(with_policy_as_conductor_lm, driver.dump_state(), config(tmp_path))
    actor = RolloutActor(with_policy_as_conductor_lm, state, config(tmp_path))
    built = actor.collector.program
    assert built.orchestrate.signature.instructions == "Write the best workflow."
    assert trainable_policy(built.orchestrate.lm) is actor.policy
