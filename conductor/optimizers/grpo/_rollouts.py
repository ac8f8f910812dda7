"""Rollouts: for each example of a step, sample G workflows from the conductor policy and run every one over the pool.

Prompts and execution go through the user's ``Conductor`` itself, so the policy trains on exactly the prompt it gets
at inference (``ConductorLM.as_dspy_lm``) and its workflows are read and run exactly as they will be:

1. a copy of the program over the example's pool (``conductor_over``) plans once with an engine that records the
   request and answers nothing: that is the prompt, as ``ConductorEngine`` would render it;
2. the policy samples G completions per prompt, all examples in one batch;
3. each completion is replayed through the same copy (an engine that answers with it): the ``WorkflowAdapter``
   parses it, the executor runs it, and ``score`` turns the prediction into a reward. Replays run in a thread pool.
   When the workflow names the conductor (a recursive round), the engine answers the round's request with one
   completion sampled from the policy then and there; the rollout keeps every round's sample.

Everything random is seeded from the run's seed, the step and the example's place, never from global RNG drift, so
a resumed run samples what an uninterrupted one would.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import dspy
from dspy.lm15 import Message, Request, Response, TextPart, Usage, response_to_events

from conductor.conductor_lm import ConductorLM, Sample
from conductor.conductor_lm._engine import request_messages
from conductor.conductor_lm._sampling import LogitsProcessorLike
from conductor.errors import ConductorError
from conductor.modules import Conductor, RunError, WorkerPool
from conductor.optimizers._rewards import Metric, Reward, score
from conductor.optimizers.grpo._config import GRPOConfig

logger = logging.getLogger(__name__)

ProcessorFactory = Callable[[Conductor], LogitsProcessorLike]
"""Makes the logits processor for prompts over one pool (e.g. the workflow grammar for ``len(conductor.pool)``
workers and ``conductor.limits.max_steps`` steps). Called once per pool size; the processor is reused."""


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed from ``keys``, the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def random_pool(pool: WorkerPool, rng: random.Random, min_size: int = 1, max_size: int | None = None) -> WorkerPool:
    """``k`` workers of ``pool`` in random order, ``k`` uniform in ``[min_size, max_size]`` (``None``: all; at most
    ``len(pool)``).

    The conductor sees them as Model 0..k-1; execution runs the real workers, since the new pool holds the same
    objects. Fallbacks are kept between workers that are both in the subset.
    """
    high = len(pool) if max_size is None else min(max_size, len(pool))
    chosen = [pool[i] for i in rng.sample(range(len(pool)), rng.randint(min_size, high))]
    names = {w.name for w in chosen}
    fallbacks = {name: [o for o in others if o in names] for name, others in pool.fallbacks.items() if name in names}
    return WorkerPool(chosen, show_descriptions=pool.show_descriptions, fallbacks=fallbacks)


def conductor_over(program: Conductor, pool: WorkerPool) -> Conductor:
    """A shallow copy of ``program`` over ``pool`` that asks whatever LM ``dspy.context`` sets and has no fallback
    (a format error earns 0 whatever a fallback answers, so training doesn't pay for one). It shares the program's
    instructions, demos, role predictors, budget and the pool's health record."""
    clone = copy.copy(program)
    clone.orchestrate = copy.copy(program.orchestrate)
    clone.orchestrate.lm = None
    clone.executor = copy.copy(program.executor)
    clone.executor.pool = clone.pool = pool
    clone.fallback = "none"
    return clone


Answer = Callable[[int, list[dict[str, str]]], Sample]
"""The sample to answer the conductor's request with, given the round (0: the first) and the request's messages."""


class _Replay:
    """A DSPy engine that answers each request with the sample ``answer`` gives (no ``answer``: an empty text) and
    keeps each request's messages, rendered as ``ConductorEngine`` renders them (and stripped as it strips its
    answer), and the samples it answered with."""

    def __init__(self, answer: Answer | None = None):
        self.answer = answer
        self.requests: list[list[dict[str, str]]] = []
        self.samples: list[Sample] = []

    def lm(self) -> dspy.LM:
        return dspy.LM("conductor/replay", engine=self, cache=False, num_retries=0)

    def complete(self, request: Request) -> Response:
        messages = request_messages(request)
        self.requests.append(messages)
        text, usage = "", Usage()
        if self.answer is not None:
            sample = self.answer(len(self.requests) - 1, messages)
            self.samples.append(sample)
            text = sample.text.strip()
            usage = Usage(input_tokens=len(sample.prompt_ids), output_tokens=len(sample.token_ids))
        return Response(
            id=None,
            model="conductor/replay",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=usage,
        )

    def stream(self, request: Request) -> Any:
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


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

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for group in self.groups for r in group]

    @property
    def completion_tokens(self) -> int:
        """Tokens of the first rounds' samples: those sampled in the batch that ``sample_s`` times."""
        return sum(len(r.sample.token_ids) for r in self.rollouts)


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
        self._processors: dict[int, LogitsProcessorLike] = {}

    def collect(self, examples: Sequence[tuple[int, dspy.Example]], step: int) -> RolloutBatch:
        """``config.group_size`` rollouts for each ``(index, example)``; an example whose prompt can't be built (an
        input error) is left out with a warning."""
        started = time.perf_counter()
        jobs = []
        for position, (index, example) in enumerate(examples):
            conductor = self._conductor(step, position)
            prompt = self._prompt(conductor, example)
            if prompt is None:
                logger.warning("step %d: example %d gives the conductor no prompt; left out", step, index)
                continue
            jobs.append((position, index, example, conductor, prompt))
        samples = self._sample([(conductor, prompt) for *_, conductor, prompt in jobs], step)
        sampled = time.perf_counter()
        with ThreadPoolExecutor(self.config.max_parallel_rollouts, thread_name_prefix="grpo-rollout") as threads:
            futures = [
                [
                    threads.submit(self._run, index, example, conductor, sample, (step, position, g))
                    for g, sample in enumerate(group)
                ]
                for (position, index, example, conductor, _), group in zip(jobs, samples, strict=True)
            ]
            groups = [[future.result() for future in group] for group in futures]
        return RolloutBatch(groups, sampled - started, time.perf_counter() - sampled)

    def _conductor(self, step: int, position: int) -> Conductor:
        pool = self.program.pool
        if self.config.randomise_pool:
            rng = random.Random(derive_seed(self.config.seed, "pool", step, position))
            pool = random_pool(pool, rng, self.config.min_pool_size, self.config.max_pool_size)
        return conductor_over(self.program, pool)

    @staticmethod
    def _prompt(conductor: Conductor, example: dspy.Example) -> list[dict[str, str]] | None:
        """The messages the conductor LM gets for ``example``, or ``None`` when the program refuses the input."""
        question = conductor.question_text(example.inputs())
        if isinstance(question, RunError):
            return None
        engine = _Replay()
        with dspy.context(lm=engine.lm(), disable_history=True):
            conductor.plan(question)
        return engine.requests[0]

    def _sample(self, jobs: list[tuple[Conductor, list[dict[str, str]]]], step: int) -> list[list[Sample]]:
        """G samples per prompt, in one batch per pool size (one batch in all without a logits processor)."""
        by_key: dict[int, list[int]] = {}
        for i, (conductor, _) in enumerate(jobs):
            by_key.setdefault(len(conductor.pool) if self.logits_processor else 0, []).append(i)
        out: list[list[Sample]] = [[] for _ in jobs]
        for key, members in by_key.items():
            processor = None
            if self.logits_processor is not None:
                if key not in self._processors:
                    self._processors[key] = self.logits_processor(jobs[members[0]][0])
                processor = self._processors[key]
            rows = self.policy.sample(
                [jobs[i][1] for i in members],
                self.config.group_size,
                max_new_tokens=self.config.max_new_tokens,
                temperature=self.config.temperature,
                top_p=self.config.top_p,
                seed=derive_seed(self.config.seed, "sample", step, key),
                logits_processor=processor,
            )
            for i, row in zip(members, rows, strict=True):
                out[i] = row
        return out

    def _run(
        self, index: int, example: dspy.Example, conductor: Conductor, sample: Sample, place: tuple[int, int, int]
    ) -> Rollout:
        """Replay ``sample`` through ``conductor`` (parse, validate, execute, recursive rounds) and score the
        prediction. ``place`` is ``(step, position of the example in the step, index of the sample in its group)``:
        a recursive round's sample is seeded from it and the round."""

        def answer(round_: int, messages: list[dict[str, str]]) -> Sample:
            if round_ == 0:
                return sample
            (recursed,) = self.policy.sample(
                [messages],
                1,
                max_new_tokens=self.config.max_new_tokens,
                temperature=self.config.temperature,
                top_p=self.config.top_p,
                seed=derive_seed(self.config.seed, "recurse", *place, round_),
                # no logits processor: the workflow grammar allows neither empty lists nor the conductor's own id
            )[0]
            return recursed

        engine = _Replay(answer)
        with dspy.context(lm=engine.lm(), disable_history=True):
            prediction = conductor(**example.inputs())
        if not engine.requests:
            raise ConductorError(f"example {index}: the conductor did not ask for a workflow on replay")
        reward = score(example, prediction, self.metric, self.config.reward)
        error = prediction.error
        return Rollout(
            example=index,
            samples=tuple(engine.samples),
            workers=tuple(conductor.pool.names),
            reward=reward,
            answer=prediction.response,
            error=None if error is None else str(error),
        )
