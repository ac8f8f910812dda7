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
from dataclasses import asdict, dataclass
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


@dataclass
class RolloutBatch:
    """A step's rollouts, one group of G per example, and where the time went."""

    groups: list[list[Rollout]]
    sample_s: float
    execute_s: float

    @classmethod
    def join(cls, shards: Sequence[RolloutBatch], *, parallel: bool) -> RolloutBatch:
        """The shards' batches as one, in order; their times add up, or the longest counts when they ran at once."""
        total = max if parallel else sum
        return cls(
            [group for shard in shards for group in shard.groups],
            total([0.0, *(shard.sample_s for shard in shards)]),
            total([0.0, *(shard.execute_s for shard in shards)]),
        )

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for group in self.groups for r in group]

    @property
    def completion_tokens(self) -> int:
        """Tokens of the first rounds' samples: those sampled in the batch that ``sample_s`` times."""
        return sum(len(r.sample.token_ids) for r in self.rollouts)


def shard_examples(
    examples: Sequence[tuple[int, dspy.Example]], config: GRPOConfig
) -> list[list[tuple[int, int, dspy.Example]]]:
    """A step's ``(index, example)`` pairs as ``config.rollout_workers`` consecutive shards of ``(position in the
    step, index, example)``: fixed by the config, whatever runs them."""
    placed = [(position, index, example) for position, (index, example) in enumerate(examples)]
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

    def collect(self, examples: Sequence[tuple[int, dspy.Example]], step: int) -> RolloutBatch:
        """``config.group_size`` rollouts for each ``(index, example)``, shard after shard; an example whose prompt
        can't be built (an input error) is left out with a warning."""
        shards = [
            self.collect_shard(shard, step, number)
            for number, shard in enumerate(shard_examples(examples, self.config))
        ]
        return RolloutBatch.join(shards, parallel=False)

    def collect_shard(self, examples: Sequence[tuple[int, int, dspy.Example]], step: int, shard: int) -> RolloutBatch:
        """The rollouts of one shard of ``shard_examples``: ``(position in the step, index, example)`` triples."""
        started = time.perf_counter()
        prompted = self._prompted(examples, step)
        samples = sample_workflows(
            self.policy,
            [(conductor, conductor.prompt_messages(question)) for *_, conductor, question in prompted],
            self.config.group_size,
            self.sampling,
            self.processors,
            # shard 0 keeps the seeds of a run in one shard (before shards existed), so those runs reproduce
            lambda key: derive_seed(self.config.seed, "sample", step, *key, *([shard] if shard else [])),
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
