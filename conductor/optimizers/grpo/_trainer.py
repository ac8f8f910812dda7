"""``GRPOTrainer``: GRPO on the conductor policy's adapter, as a recipe a reader can hold in their head.

Each step takes ``batch_size`` training examples, samples ``group_size`` workflows for each from the policy, runs
every one over the pool (``_rollouts.py``, through the optimizers' rollout loop), turns outcomes into rewards
(``score``), normalises them within each example's group and takes ``updates_per_batch`` clipped-surrogate steps on
them (``_loss.py``). A group whose rewards all agree teaches nothing, so with ``resample_agreeing`` the step first
replaces such groups by groups of the next examples (DAPO's dynamic sampling, ``collect``). Checkpoints
(``optimizers/_checkpoint.py``, shared with the warm start) and metrics (``_metrics.py``) make a long run resumable
and observable.

Why not TRL's ``GRPOTrainer`` (the design's first choice; TRL 1.16 and transformers 5.24 as installed):

- Recursion can't be expressed: a recursive rollout is two or more conductor completions, the second sampled from
  the policy *during* execution, prompted with the first one's executed answer, and all of them are trained. TRL's
  unit is one completion per rollout (``rollout_func`` may return one completion and an ``env_mask``, not two
  completions with their own prompts).
- Its checkpoints are not crash-safe: ``Trainer._save_checkpoint`` writes model, optimizer, scheduler and RNG files
  one by one into ``checkpoint-N`` in place, and ``resume_from_checkpoint=True`` picks the highest-numbered folder
  (``get_last_checkpoint``), so a run killed during a save resumes from a half-written checkpoint. Our requirement
  (killed at any moment, lose at most the step in progress) means overriding that method.
- Everything else would be overridden too: our prompts (rendered by the ``Conductor``), per-example random pools,
  per-step seeds and the workflow grammar per pool need TRL's ``rollout_func``, which 1.16 marks experimental
  ("may change or be removed at any time"); the reward is ours (``score``), and the loss is to be the small function
  in ``_loss.py``. What TRL would still contribute is the Hugging Face ``Trainer`` loop, bought with its private
  methods as our extension points.
- Speed gives no reason to prefer it. Measured on the same 2-core machine in the same hour (busy: load about 6),
  one torch thread, SmolLM2-135M with LoRA r=16 on every projection, fp32, 2 prompts x 4 completions of 128 free
  tokens, the same 376-token Orchestrate prompt, varied rewards: TRL 1.16 took 197 s and 176 s per step; this loop
  50 s sampling + 107 s update = 158 s with all 8 rollouts scored, and 77 s when one group scored alike (its
  rollouts carry no gradient and are skipped). Same work, same order of cost; the prototype's 16-33 s per step was
  on a quieter machine.

So the loop is written here, in the shape of torchtune's GRPO recipe: ``setup`` / ``train`` / ``save_checkpoint`` /
``cleanup``, with every random choice seeded from ``(seed, step)`` so that a resumed run reproduces an uninterrupted
one exactly.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy
import numpy as np
import torch

from conductor.conductor_lm import ConductorLM, Sample
from conductor.errors import ConductorError, ConfigError
from conductor.modules import Conductor
from conductor.optimizers._checkpoint import checkpoints, no_save_bars, read_checkpoint, write_checkpoint
from conductor.optimizers._optim import adamw_with_warmup, optimizer_step
from conductor.optimizers._rewards import Metric
from conductor.optimizers._rollouts import ProcessorFactory
from conductor.optimizers.grpo._actors import RayRollouts, RolloutSetup
from conductor.optimizers.grpo._config import GRPOConfig, load_config
from conductor.optimizers.grpo._loss import group_advantages, grpo_loss, pad
from conductor.optimizers.grpo._metrics import MetricsLog, StepMetrics
from conductor.optimizers.grpo._rollouts import RolloutBatch, RolloutCollector, derive_seed, rewards_agree

logger = logging.getLogger(__name__)

POLICY = "policy"
"""Where ``train`` writes the final policy in ``output_dir`` (``ConductorLM.load`` reads it)."""


class GRPOTrainer:
    """Trains ``policy`` (in place) to write workflows that ``program`` runs well on ``trainset``.

    Args:
        config: a ``GRPOConfig``, or a mapping validated into one.
        policy: the conductor policy; its trainable weights (the LoRA adapter) are updated.
        program: the ``Conductor`` whose prompt, workflow parsing, executor and pool the rollouts go through; its own
            conductor LM is not used while training (the policy samples), so it may be ``policy.as_dspy_lm()``.
        trainset: ``dspy.Example``s with their inputs marked (``with_inputs``).
        metric: ``metric(example, prediction)``: a bool or a number in [0, 1]; ``config.reward`` makes it a reward.
        logits_processor: makes a logits processor per pool (see ``ProcessorFactory``), e.g. the workflow grammar.
        rollout_setup: with ``config.ray``: a picklable function that builds, in each rollout actor, a
            ``RolloutSetup`` like these arguments (the policy with the same base weights, the program, the metric and
            the logits processor factory); the actors take the program's prompts and the policy's adapter from here.

    ``train()`` runs ``setup()`` first if needed; call ``cleanup()`` at the end (or use ``run()``, which does all).
    """

    def __init__(
        self,
        config: GRPOConfig | Mapping[str, Any],
        policy: ConductorLM,
        program: Conductor,
        trainset: Sequence[dspy.Example],
        metric: Metric,
        *,
        logits_processor: ProcessorFactory | None = None,
        rollout_setup: Callable[[], RolloutSetup] | None = None,
    ):
        self.config = load_config(config)
        self.policy = policy
        self.program = program
        self.trainset = list(trainset)
        self.metric = metric
        self.logits_processor = logits_processor
        self.rollout_setup = rollout_setup
        self.rollouts: RolloutCollector | RayRollouts | None = None
        """Set by ``setup``: where each step's rollouts are collected."""
        self.step = 0
        """Steps completed (the next one is ``step + 1``)."""
        self.drawn = 0
        """Examples the completed steps drew from the epoch orders (``examples_at``): the next step starts there."""
        self.log: MetricsLog | None = None
        """Set by ``setup``, last of all: a trainer is ready once it has one."""
        self._orders: dict[int, list[int]] = {}

    @property
    def output_dir(self) -> Path:
        return self.config.output_dir

    # ---- setup -------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Check the inputs, build optimizer and schedule, and restore the newest checkpoint when resuming."""
        config = self.config
        self._check()
        self.params = self.policy.trainable_parameters()
        # the weights this run starts from, read before a checkpoint replaces them: a resumed run keeps its reference
        self.start_weights = [p.detach().clone() for p in self.params] if config.reference == "start" else None
        self.optimizer, self.scheduler = adamw_with_warmup(
            self.params,
            lr=config.lr,
            weight_decay=config.weight_decay,
            steps=config.steps * config.updates_per_batch,
            warmup_ratio=config.warmup_ratio,
            schedule=config.schedule,
        )
        history: list[dict[str, Any]] = []
        found = checkpoints(self.output_dir)
        if found and not config.resume:
            raise ConductorError(
                f"{self.output_dir} holds checkpoints of an earlier run: set resume=True to continue it, or choose "
                "another output_dir"
            )
        if found:
            checkpoint = read_checkpoint(found[-1], self.policy, self.optimizer, self.scheduler)
            changed = sorted(k for k, v in config.fingerprint().items() if checkpoint.fingerprint.get(k) != v)
            if changed:
                logger.warning("resuming with changed settings %s: the run won't reproduce the original", changed)
            self.step, history = checkpoint.step, checkpoint.metrics
            # each step's metrics say what it drew (steps logged before resampling existed drew no replacements)
            self.drawn = sum(config.batch_size + m.get("resampled_groups", 0) for m in history)
        elif config.resume:
            logger.info("no checkpoint in %s: starting from step 0", self.output_dir)
        if config.ray is None:
            self.rollouts = RolloutCollector(self.policy, self.program, self.metric, config, self.logits_processor)
        else:
            self.rollouts = RayRollouts(self.policy, self.program, config, self.rollout_setup)
        self.log = MetricsLog(self.output_dir, config.steps, history, progress=config.progress)

    def _check(self) -> None:
        """Every problem with the trainer's inputs at once, as one ``ConfigError``."""
        config, problems = self.config, []
        if not self.trainset:
            problems.append("the trainset is empty")
        unmarked = [i for i, e in enumerate(self.trainset) if not isinstance(e, dspy.Example) or not _has_inputs(e)]
        if unmarked:
            problems.append(f"trainset{unmarked[:5]} are not dspy.Examples with inputs marked (.with_inputs(...))")
        unlabelled = [i for i, e in enumerate(self.trainset) if config.balance_by and config.balance_by not in e]
        if unlabelled:
            problems.append(f"balance_by={config.balance_by!r}: trainset{unlabelled[:5]} have no such label")
        if config.randomise_pool and config.min_pool_size > len(self.program.pool):
            problems.append(f"min_pool_size={config.min_pool_size} exceeds the pool's {len(self.program.pool)} workers")
        if config.beta > 0 and config.reference == "base" and not self.policy.is_peft:
            problems.append(
                "beta > 0 with reference 'base' needs a LoRA policy: the reference is the base model with the adapter "
                "disabled (reference 'start' works for any policy)"
            )
        if not self.policy.trainable_parameters():
            problems.append("the policy has no trainable weights")
        if config.ray is not None and self.rollout_setup is None:
            problems.append(
                "rollouts on Ray (ray=...) need rollout_setup: how each actor builds its policy and program"
            )
        if problems:
            raise ConfigError("can't train with GRPO:\n" + "\n".join(f"  {p}" for p in problems))

    # ---- training ----------------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run the remaining steps, checkpointing every ``checkpoint_every`` and after the last; write the final
        policy to ``output_dir/policy``. Returns every step's metrics."""
        if self.log is None:
            self.setup()
        for step in range(self.step + 1, self.config.steps + 1):
            self.train_step(step)
            if step % self.config.checkpoint_every == 0 or step == self.config.steps:
                self.save_checkpoint()
        with no_save_bars():
            self.policy.save(self.output_dir / POLICY)
        return self.log.history

    def train_step(self, step: int) -> StepMetrics:
        """Sample, run and score the rollouts of ``step`` (1-based), update the policy on them and log the step."""
        self._seed(step)
        batch = self.collect(step)
        lr = self.optimizer.param_groups[0]["lr"]
        started = time.perf_counter()
        update = self.update(batch, step)
        metrics = StepMetrics.of(step, batch, lr, update | {"update_s": time.perf_counter() - started})
        self.log.log(metrics, batch)
        self.step = step
        self.drawn += self.config.batch_size + batch.resampled
        return metrics

    def collect(self, step: int) -> RolloutBatch:
        """The rollouts of ``step``: a group for each of the next ``batch_size`` examples of the epoch orders.

        With ``resample_agreeing``, up to that many rounds then drop the groups whose rewards all agree (a peaked
        policy's usually do, and they add no gradient) and roll out groups of the examples after them in their place,
        until ``batch_size`` groups disagree (DAPO's dynamic sampling). Replacements are drawn in the epoch order, so
        every example keeps its turn; the next step goes on after the last one drawn."""
        size = self.config.batch_size
        batch = self.rollouts.collect(self.examples_at(self.drawn, size), step)
        for _ in range(self.config.resample_agreeing):
            missing = size - sum(not rewards_agree(group) for group in batch.groups)
            if missing == 0:
                break
            drawn = size + batch.resampled  # by this step so far: the replacements' positions in the step follow
            more = self.rollouts.collect(self.examples_at(self.drawn + drawn, missing), step, start=drawn)
            batch = batch.resampled_with(more, missing)
        return batch

    def _seed(self, step: int) -> None:
        """Seed the global RNGs from ``(seed, step)``: anything that draws from them (LoRA dropout, a worker) draws
        the same in a resumed run."""
        random.seed(derive_seed(self.config.seed, "python", step))
        np.random.seed(derive_seed(self.config.seed, "numpy", step) % 2**32)
        torch.manual_seed(derive_seed(self.config.seed, "torch", step))

    def examples_at(self, place: int, count: int) -> list[tuple[int, dspy.Example]]:
        """``count`` ``(index, example)`` pairs from the ``place``-th (0-based) on, in the epoch orders laid end to
        end: a fresh order of the trainset per epoch."""
        n = len(self.trainset)
        picked = []
        for position in range(place, place + count):
            epoch, offset = divmod(position, n)
            if epoch not in self._orders:
                self._orders = {epoch: self._epoch_order(epoch)}
            index = self._orders[epoch][offset]
            picked.append((index, self.trainset[index]))
        return picked

    def _epoch_order(self, epoch: int) -> list[int]:
        """A seeded shuffle of the trainset; with ``balance_by``, each label's examples shuffled and dealt in turn
        (the labels in a shuffled order each round), so that a batch holds as many labels as it can.

        Balanced batches keep GRPO's signal alive: a batch of one task family can be won by always choosing the
        same worker, and the update learns just that."""
        rng = random.Random(derive_seed(self.config.seed, "data", epoch))
        label = self.config.balance_by
        if label is None:
            return rng.sample(range(len(self.trainset)), len(self.trainset))
        groups: dict[str, list[int]] = {}
        for index, example in enumerate(self.trainset):
            groups.setdefault(str(example.get(label)), []).append(index)
        queues = [rng.sample(members, len(members)) for _, members in sorted(groups.items())]
        order = []
        while queues:
            rng.shuffle(queues)
            order.extend(queue.pop() for queue in queues)
            queues = [queue for queue in queues if queue]
        return order

    def update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        """``updates_per_batch`` optimizer steps on the clipped surrogate, each over ``grad_accumulation``
        micro-batches, or more where one would hold over ``max_sequences_per_pass`` sequences.

        With ``beta == 0`` a rollout whose advantage is 0 (every rollout of a group that scored alike) adds nothing
        to the gradient, so only the others are scored: the same update for less compute; with none, the weights
        stay as they are. The old log-probs (of the weights that sampled) are the new ones detached when there is one
        update per batch, where they are equal, else a pass without gradient before the first update. Every sample of
        a rollout (its recursive rounds' too) is a sequence trained with the rollout's advantage.
        """
        config, rollouts = self.config, batch.rollouts
        advantages, sequences = self._trained_sequences(batch, step)
        prompts = [sample.prompt_ids for _, sample in sequences]
        completions = [sample.token_ids for _, sample in sequences]
        sums = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        if not sequences:
            # Every group agreed: nothing to learn, so no optimizer step (the schedule counts those). One on zero
            # gradients would still move the weights, along AdamW's momentum from earlier steps.
            return sums
        old = ref = None
        if config.updates_per_batch > 1:
            old = self.policy.sequence_logprobs(prompts, completions, temperature=config.temperature)
        if config.beta > 0:
            with self._reference_weights():
                ref = self.policy.sequence_logprobs(prompts, completions, temperature=config.temperature)
        passes = max(config.grad_accumulation, math.ceil(len(sequences) / (config.max_sequences_per_pass or math.inf)))
        chunks = [c.tolist() for c in np.array_split(np.arange(len(sequences)), passes) if len(c)]
        total = sum(len(r.samples) for r in rollouts)
        self.policy.train()
        try:
            for _ in range(config.updates_per_batch):
                for chunk in chunks:
                    new = self.policy.sequence_logprobs(
                        [prompts[j] for j in chunk],
                        [completions[j] for j in chunk],
                        grad=True,
                        temperature=config.temperature,
                    )
                    logprobs, mask = pad(new)
                    out = grpo_loss(
                        logprobs,
                        pad([old[j] for j in chunk])[0] if old is not None else logprobs.detach(),
                        advantages[[sequences[j][0] for j in chunk]],
                        mask,
                        clip=config.clip,
                        beta=config.beta,
                        ref_logprobs=pad([ref[j] for j in chunk])[0] if ref is not None else None,
                    )
                    share = len(chunk) / total  # the loss is a mean over all sequences, inactive ones too
                    (out.loss * share).backward()
                    sums["loss"] += out.loss.item() * share
                    sums["kl"] += out.kl * len(chunk) / len(sequences)
                    sums["clip_fraction"] += out.clip_fraction * len(chunk) / len(sequences)
                sums["grad_norm"] += optimizer_step(self.optimizer, self.scheduler, self.params, config.max_grad_norm)
        finally:
            self.policy.eval()
        return {k: v / config.updates_per_batch for k, v in sums.items()}

    def _trained_sequences(self, batch: RolloutBatch, step: int) -> tuple[torch.Tensor, list[tuple[int, Sample]]]:
        """Each rollout's advantage within its group, and the ``(rollout, sample)`` sequences the update trains on:
        every sample of the rollouts whose advantage is not 0 (all of them with a KL term)."""
        rollouts = batch.rollouts
        if rollouts and all(not r.reward.format_ok for r in rollouts):
            logger.warning("step %d: no sampled workflow was usable (all format errors): nothing to learn", step)
        rewards = torch.tensor([[r.reward.value for r in group] for group in batch.groups], dtype=torch.float32)
        eps = self.config.advantage_eps
        advantages = group_advantages(rewards, eps).flatten() if batch.groups else rewards.flatten()
        active = [i for i, a in enumerate(advantages.tolist()) if a != 0 or self.config.beta > 0]
        return advantages, [(i, sample) for i in active for sample in rollouts[i].samples]

    @contextlib.contextmanager
    def _reference_weights(self) -> Iterator[None]:
        """The KL term's reference in place of the policy for the block: the base model (the adapter disabled), or
        the weights this run started from, copied in and the current ones put back after."""
        if self.start_weights is None:
            with self.policy.model.disable_adapter():
                yield
            return
        current = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for param, start in zip(self.params, self.start_weights, strict=True):
                param.copy_(start)
        try:
            yield
        finally:
            with torch.no_grad():
                for param, value in zip(self.params, current, strict=True):
                    param.copy_(value)

    # ---- checkpoints and the end ------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the steps done so far (see ``_checkpoint.py``) and redraw the reward curve."""
        started = time.perf_counter()
        folder = write_checkpoint(
            self.output_dir,
            self.step,
            self.policy,
            self.optimizer,
            self.scheduler,
            self.log.history,
            self.config.fingerprint(),
            self.config.keep_checkpoints,
        )
        self.log.plot()
        logger.info("checkpoint %s written in %.2f s", folder, time.perf_counter() - started)
        return folder

    def cleanup(self) -> None:
        """Stop the rollout actors, draw the final reward curve and close the progress bar."""
        if isinstance(self.rollouts, RayRollouts):
            self.rollouts.close()
        if self.log is not None:
            self.log.plot()
            self.log.close()

    def run(self) -> list[dict[str, Any]]:
        """``setup``, ``train`` and ``cleanup`` (even when training fails)."""
        try:
            self.setup()
            return self.train()
        finally:
            self.cleanup()


def _has_inputs(example: dspy.Example) -> bool:
    try:
        return bool(example.inputs())
    except ValueError:  # inputs never marked
        return False
