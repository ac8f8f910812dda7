"""GRPO rollouts in Ray actors: each of ``config.rollout_workers`` actors holds its own copy of the policy (for
sampling) and of the program and its pool, and collects one shard of every step; the learner stays on the driver.

An actor builds what it holds by calling ``rollout_setup`` (a picklable function, so that models load where they
run instead of being pickled), takes the driver program's prompts and demos (``prompt_state``), and before each shard
loads the driver's current trainable weights, put once per step in Ray's object store. A shard is seeded by the
step and its number (``_rollouts.py``), never by the actor that runs it, so a run on Ray samples exactly what
``RolloutCollector`` samples in this process. An actor that dies is restarted and its shard redone
(``max_restarts``, ``max_task_retries``): the run goes on with the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
import torch

from conductor._ray import ONE_THREAD, connect
from conductor.conductor_lm import ConductorLM
from conductor.modules import Conductor
from conductor.optimizers._rewards import Metric
from conductor.optimizers._rollouts import ProcessorFactory
from conductor.optimizers.grpo._config import GRPOConfig
from conductor.optimizers.grpo._rollouts import RolloutBatch, RolloutCollector, shard_examples

RESTARTS = 3
"""How often an actor that died is restarted, and a shard it was running retried, before the run fails."""


@dataclass
class RolloutSetup:
    """What a rollout actor builds for itself: a policy with the driver's base weights (its trainable weights are
    overwritten from the driver's), the program, the metric and the logits processor factory."""

    policy: ConductorLM
    program: Conductor
    metric: Metric
    logits_processor: ProcessorFactory | None = None


def trainable_weights(policy: ConductorLM) -> dict[str, torch.Tensor]:
    """The weights an update changes (the LoRA adapter), by name, on the CPU."""
    return {name: p.detach().cpu() for name, p in policy.model.named_parameters() if p.requires_grad}


def prompt_state(program: Conductor) -> dict[str, Any]:
    """``program.dump_state()`` without its LMs: each predictor's prompts and demos, what an actor takes from the
    driver. The actor's program has its LMs from ``setup`` (the conductor LM is its own policy); a policy's LM can't
    be dumped before the policy is saved, nor rebuilt from state."""
    with program.lms_set_aside():
        return program.dump_state()


class RolloutActor:
    """One Ray actor's rollouts (see the module docstring)."""

    def __init__(self, setup: Callable[[], RolloutSetup], program_state: dict[str, Any], config: GRPOConfig):
        torch.set_num_threads(1)
        built = setup()
        built.program.load_state(program_state)
        self.policy = built.policy
        self.collector = RolloutCollector(built.policy, built.program, built.metric, config, built.logits_processor)

    def collect(
        self,
        weights: dict[str, torch.Tensor],
        examples: Sequence[tuple[int, int, dspy.Example]],
        step: int,
        shard: int,
        start: int,
    ) -> RolloutBatch:
        """The shard's rollouts, sampled with ``weights`` loaded into the policy."""
        params = dict(self.policy.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value)
        return self.collector.collect_shard(examples, step, shard, start)


class RayRollouts:
    """``RolloutCollector``'s ``collect``, its shards run at once in ``config.rollout_workers`` Ray actors on the
    cluster at ``config.ray``; the weights they sample with are ``policy``'s as they are at each ``collect``."""

    def __init__(self, policy: ConductorLM, program: Conductor, config: GRPOConfig, setup: Callable[[], RolloutSetup]):
        self.ray = connect(config.ray)
        self.policy = policy
        self.config = config
        remote = self.ray.remote(RolloutActor).options(**ONE_THREAD, max_restarts=RESTARTS, max_task_retries=RESTARTS)
        state = prompt_state(program)
        self.actors = [remote.remote(setup, state, config) for _ in range(config.rollout_workers)]

    def collect(self, examples: Sequence[tuple[int, dspy.Example]], step: int, start: int = 0) -> RolloutBatch:
        weights = self.ray.put(trainable_weights(self.policy))  # once per collect, read by every actor
        shards = shard_examples(examples, self.config, start)
        pending = [
            actor.collect.remote(weights, shard, step, number, start)
            for number, (actor, shard) in enumerate(zip(self.actors, shards, strict=False))
        ]
        return RolloutBatch.join(self.ray.get(pending), parallel=True)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []
