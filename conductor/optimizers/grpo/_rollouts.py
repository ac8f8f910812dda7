"""GRPO's rollouts: for each example of a step, sample G workflows from the conductor policy and run every one over
the pool, through the optimizers' one rollout loop (``conductor/optimizers/_rollouts.py``).

The user's ``Conductor`` owns the prompt and how a completion becomes a workflow, so the policy trains on exactly the
prompt it gets at inference and its workflows are read and run exactly as they will be:

1. a copy of the program over the example's pool (``rollout_program``, without fallback: a format error earns 0
   whatever a fallback answers, so training doesn't pay for one) gives the messages (``Conductor.prompt_messages``);
2. the policy samples G completions per prompt, all examples of a shard in one batch (``sample_workflows``;
   ``rollout_workers`` shards per step, one by default; with Ray each shard runs in its own actor, ``_actors.py``);
3. the copy reads each completion (``read_completion``) and runs it (``run_reply``), and ``score`` turns the
   prediction into a reward (``run_and_score``). Runs go to a thread pool. When the workflow names the conductor (a
   recursive round), the round's messages (``revision_messages``) get one completion sampled from the policy then
   and there, under the round's own logits processor (the grammar of a recursive round); the rollout keeps every
   round's sample.

Everything random is seeded from the run's seed, the step, the shard and the example's place, never from global RNG
drift or from which process runs a shard, so a resumed run samples what an uninterrupted one would, and a run on Ray
what one in this process would.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import dspy

from conductor._ray import consecutive_shards
from conductor.conductor_lm import ConductorLM, Sample
from conductor.modules import AskRevision, Conductor, ConductorReply, RunError, Usage, WorkerPool, Workflow
from conductor.optimizers._rewards import Metric, Reward
from conductor.optimizers._rollouts import (
    ProcessorFactory,
    Processors,
    RolloutJob,
    Sampling,
    ScoredRun,
    rollout_program,
    run_and_score,
    sample_workflows,
)
from conductor.optimizers.grpo._config import GRPOConfig

logger = logging.getLogger(__name__)


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed from ``keys``, the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def random_pool(pool: WorkerPool, rng: random.Random, min_size: int = 1, max_size: int | None = None) -> WorkerPool:
    """``k`` workers of ``pool`` in random order, ``k`` uniform in ``[min_size, max_size]`` (``None``: all; at most
    ``len(pool)``): the conductor sees them as Model 0..k-1, execution runs the real workers (``WorkerPool.subset``).
    """
    high = len(pool) if max_size is None else min(max_size, len(pool))
    return pool.subset(rng.sample(range(len(pool)), rng.randint(min_size, high)))


@dataclass(frozen=True)
class Rollout:
    """One sampled workflow and what running it earned.

    ``workers[i]`` is the real worker the conductor saw as Model i; ``samples`` hold the prompt and completion token
    ids the update trains on: the sampled workflow's, then one per recursive round.
    """

    example: int
    samples: tuple[Sample, ...]
    workers: tuple[str, ...]
    reward: Reward
    answer: str | None
    error: str | None

    @property
    def sample(self) -> Sample:
        """The sampled workflow (the first round's)."""
        return self.samples[0]

    def record(self) -> dict[str, Any]:
        """The JSON line ``rollouts.jsonl`` keeps for this rollout: ``text`` is the first round's, each recursive
        round's follows in ``recursive_rounds``."""
        return {
            "example": self.example,
            "workers": list(self.workers),
            "reward": asdict(self.reward),
            "answer": self.answer,
            "error": self.error,
            "completion_tokens": len(self.sample.token_ids),
            "text": self.sample.text,
            "recursive_rounds": [{"completion_tokens": len(s.token_ids), "text": s.text} for s in self.samples[1:]],
        }


def rewards_agree(group: Sequence[Rollout]) -> bool:
    """Whether every rollout of ``group`` earned the same reward: its advantages are all 0, so it adds no gradient."""
    return len({r.reward.value for r in group}) == 1


@dataclass
class RolloutBatch:
    """A step's rollouts, one group of G per example, and where the time went; with ``resample_agreeing``, also the
    groups that agreed and were replaced (``resampled_with``)."""

    groups: list[list[Rollout]]
    """The groups the update trains on."""
    sample_s: float
    execute_s: float
    dropped: list[list[Rollout]] = field(default_factory=list)
    """Groups whose rewards all agreed, replaced by groups of further examples: run, but not trained on."""
    resampled: int = 0
    """Further examples drawn to replace groups that agreed (or that an input error left out)."""

    @classmethod
    def join(cls, shards: Sequence[RolloutBatch], *, parallel: bool) -> RolloutBatch:
        """The shards' batches as one, in order; their times add up, or the longest counts when they ran at once."""
        total = max if parallel else sum
        return cls(
            [group for shard in shards for group in shard.groups],
            total([0.0, *(shard.sample_s for shard in shards)]),
            total([0.0, *(shard.execute_s for shard in shards)]),
        )

    def resampled_with(self, more: RolloutBatch, drawn: int) -> RolloutBatch:
        """This batch with its agreeing groups dropped and ``more``'s groups, of ``drawn`` further examples, added."""
        return RolloutBatch(
            [group for group in self.groups if not rewards_agree(group)] + more.groups,
            self.sample_s + more.sample_s,
            self.execute_s + more.execute_s,
            self.dropped + [group for group in self.groups if rewards_agree(group)],
            self.resampled + drawn,
        )

    @property
    def rollouts(self) -> list[Rollout]:
        """The rollouts the update trains on."""
        return [r for group in self.groups for r in group]

    @property
    def all_rollouts(self) -> list[Rollout]:
        """Every rollout the batch ran: those trained on, then the dropped ones."""
        return self.rollouts + [r for group in self.dropped for r in group]

    @property
    def completion_tokens(self) -> int:
        """Tokens of the first rounds' samples: those sampled in the batches that ``sample_s`` times."""
        return sum(len(r.sample.token_ids) for r in self.all_rollouts)


def shard_examples(
    examples: Sequence[tuple[int, dspy.Example]], config: GRPOConfig, start: int = 0
) -> list[list[tuple[int, int, dspy.Example]]]:
    """A step's ``(index, example)`` pairs as ``config.rollout_workers`` consecutive shards of ``(position in the
    step, index, example)``, positions counted from ``start``: fixed by the config, whatever runs them."""
    placed = [(position, index, example) for position, (index, example) in enumerate(examples, start)]
    return consecutive_shards(placed, config.rollout_workers)


class RolloutCollector:
    """Samples and runs the rollouts of one step (see the module docstring)."""

    def __init__(
        self,
        policy: ConductorLM,
        program: Conductor,
        metric: Metric,
        config: GRPOConfig,
        logits_processor: ProcessorFactory | None = None,
    ):
        self.policy = policy
        self.program = program
        self.metric = metric
        self.config = config
        self.logits_processor = logits_processor
        self.processors = Processors(logits_processor)
        self.sampling = Sampling(config.max_new_tokens, config.temperature, config.top_p)

    def collect(self, examples: Sequence[tuple[int, dspy.Example]], step: int, start: int = 0) -> RolloutBatch:
        """``config.group_size`` rollouts for each ``(index, example)``, shard after shard; an example whose prompt
        can't be built (an input error) is left out with a warning. ``start``: the first example's position in the
        step (0 for the step's batch; past the examples drawn before for the groups that replace agreeing ones)."""
        shards = [
            self.collect_shard(shard, step, number, start)
            for number, shard in enumerate(shard_examples(examples, self.config, start))
        ]
        return RolloutBatch.join(shards, parallel=False)

    def collect_shard(
        self, examples: Sequence[tuple[int, int, dspy.Example]], step: int, shard: int, start: int = 0
    ) -> RolloutBatch:
        """The rollouts of one shard of ``shard_examples(..., start)``: ``(position in the step, index, example)``
        triples."""
        started = time.perf_counter()
        prompted = self._prompted(examples, step)
        samples = sample_workflows(
            self.policy,
            [(conductor, conductor.prompt_messages(question)) for *_, conductor, question in prompted],
            self.config.group_size,
            self.sampling,
            self.processors,
            # the step's batch (start 0) keeps the seeds of runs before resampling existed, and its shard 0 those of
            # runs before shards existed, so those runs reproduce
            lambda key: derive_seed(
                self.config.seed, "sample", step, *key, *([shard] if shard else []), *(["from", start] if start else [])
            ),
        )
        sampled = time.perf_counter()
        jobs: list[RolloutJob] = []
        rounds: list[list[Sample]] = []  # per rollout: the sampled workflow, then one sample per recursive round
        indices: list[int] = []
        for (position, index, example, conductor, question), group in zip(prompted, samples, strict=True):
            for g, sample in enumerate(group):
                rounds.append([sample])
                ask = self._ask_revision(conductor, rounds[-1], (step, position, g))
                jobs.append(RolloutJob(example, sample.text, conductor, question, _usage(sample), ask))
                indices.append(index)
        runs = run_and_score(
            self.program,
            jobs,
            self.metric,
            self.config.reward,
            threads=self.config.max_parallel_rollouts,
            thread_name_prefix="grpo-rollout",
        )
        made = iter(map(_rollout, indices, rounds, jobs, runs))
        groups = [[next(made) for _ in group] for group in samples]
        return RolloutBatch(groups, sampled - started, time.perf_counter() - sampled)

    def _prompted(
        self, examples: Sequence[tuple[int, int, dspy.Example]], step: int
    ) -> list[tuple[int, int, dspy.Example, Conductor, str]]:
        """Each example with the program over its pool (``_conductor``) and its question; an example that gives the
        conductor no prompt is left out with a warning."""
        prompted = []
        for position, index, example in examples:
            conductor = self._conductor(step, position)
            question = conductor.question_text(example.inputs())
            if isinstance(question, RunError):
                logger.warning(
                    "step %d: example %d gives the conductor no prompt (%s); left out", step, index, question
                )
                continue
            prompted.append((position, index, example, conductor, question))
        return prompted

    def _conductor(self, step: int, position: int) -> Conductor:
        """The program over the pool of the step's ``position``-th example, without fallback (see the docstring)."""
        pool = self.program.pool
        if self.config.randomise_pool:
            rng = random.Random(derive_seed(self.config.seed, "pool", step, position))
            pool = random_pool(pool, rng, self.config.min_pool_size, self.config.max_pool_size)
        return rollout_program(self.program, pool)

    def _ask_revision(self, conductor: Conductor, samples: list[Sample], place: tuple[int, int, int]) -> AskRevision:
        """How a rollout through ``conductor`` asks for a recursive round: one completion sampled from the policy then
        and there, under the round's logits processor, and appended to ``samples``. ``place`` is ``(step, position of
        the example in the step, index of the sample in its group)``: the round's sample is seeded from it and the
        round."""

        def ask_revision(question: str, workflow: Workflow, previous: dspy.Prediction, depth: int) -> ConductorReply:
            (revision,) = self.sampling.sample(
                self.policy,
                [conductor.revision_messages(question, workflow, previous, depth)],
                1,
                seed=derive_seed(self.config.seed, "recurse", *place, depth),
                logits_processor=self.processors(conductor, depth),
            )[0]
            samples.append(revision)
            return conductor.read_completion(revision.text, depth)._replace(usage=_usage(revision))

        return ask_revision


def _rollout(index: int, samples: list[Sample], job: RolloutJob, run: ScoredRun) -> Rollout:
    """The rollout of the ``index``-th training example that ``job`` ran, with every round's sample."""
    error = run.prediction.error
    return Rollout(
        example=index,
        samples=tuple(samples),
        workers=tuple(job.program.pool.names),
        reward=run.reward,
        answer=run.prediction.response,
        error=None if error is None else str(error),
    )


def _usage(sample: Sample) -> Usage:
    """What the policy spent on ``sample``: its tokens count in the run like an API conductor's (a local model is
    free)."""
    return Usage(len(sample.prompt_ids), len(sample.token_ids))
