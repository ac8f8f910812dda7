"""The rollout loop: sample workflows from the conductor policy, run each over the program's pool, score it.

Every method that learns from workflows the policy wrote collects them here: expert iteration, and GRPO's
``RolloutCollector`` (in this process or in Ray actors, ``grpo/_actors.py``).

1. ``sample_workflows``: the policy samples ``n`` completions per prompt, in one batch per workflow grammar
   (``grammar_key``; one batch in all without a logits processor), each batch seeded by the caller;
2. ``run_and_score``: each completion is read and run by its program (``read_completion``, ``run_reply``) on a pool of
   threads, and ``score`` turns the prediction into a reward. A recursive round asks the job's ``ask_revision`` (GRPO
   samples it from the policy then and there) or, without one, the program's own conductor LM.

``run_and_score`` also stands alone, for workflows nobody sampled: program search scores its candidates with it.
Rollouts run through copies of the program without fallback (``rollout_program``): a format error earns 0 whatever a
fallback answers, so a rollout never pays for one.

Importing this module needs no torch; sampling does, through the policy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dspy

from conductor.local import LogitsProcessorLike, Sample
from conductor.modules import AskRevision, Conductor, RunError, Usage, WorkerPool, Workflow
from conductor.optimizers._rewards import Metric, Reward, RewardConfig, score

if TYPE_CHECKING:
    from conductor.conductor_lm import ConductorLM

Messages = list[dict[str, str]]

ProcessorFactory = Callable[[Conductor, int], LogitsProcessorLike]
"""Makes the logits processor for the prompts of round ``depth`` (0: the first) over one pool (e.g. the workflow
grammar of that round, ``constraint_factory``). Called once per grammar (``grammar_key``) and round; the processor
is reused."""


def grammar_key(conductor: Conductor) -> tuple[int | str, ...]:
    """What the workflow grammar over ``conductor``'s pool depends on: the pool's size, and, when workflows name
    workers (``worker_ids: names``), which workers it holds (not their order: the grammar lists names sorted)."""
    names = sorted(conductor.pool.names) if conductor.worker_ids == "names" else []
    return (len(conductor.pool), *names)


def rollout_program(program: Conductor, pool: WorkerPool | None = None) -> Conductor:
    """A copy of ``program`` over ``pool`` (``None``: its own) that runs no fallback: a format error earns 0 whatever
    a fallback answers, so a rollout never pays for one."""
    runner = program.copy_with(pool=pool)
    runner.fallback = "none"
    return runner


class Processors:
    """The logits processor of each grammar and round, made once by ``factory`` (``None``: no processor) and shared
    by the threads that ask for it."""

    def __init__(self, factory: ProcessorFactory | None):
        self.factory = factory
        self._made: dict[tuple[int | str, ...], LogitsProcessorLike] = {}
        self._lock = threading.Lock()

    def __call__(self, conductor: Conductor, depth: int) -> LogitsProcessorLike | None:
        """The logits processor of round ``depth`` over ``conductor``'s pool."""
        if self.factory is None:
            return None
        with self._lock:
            key = (*grammar_key(conductor), depth)
            if key not in self._made:
                self._made[key] = self.factory(conductor, depth)
            return self._made[key]


@dataclass(frozen=True)
class Sampling:
    """How the policy samples a workflow: ``LocalModel.sample``'s settings."""

    max_new_tokens: int
    temperature: float
    top_p: float = 1.0

    def sample(
        self,
        policy: ConductorLM,
        prompts: Sequence[Messages],
        n: int,
        *,
        seed: int,
        logits_processor: LogitsProcessorLike | None,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt from ``policy`` with these settings."""
        return policy.sample(
            prompts,
            n,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
            logits_processor=logits_processor,
        )


def sample_workflows(
    policy: ConductorLM,
    prompts: Sequence[tuple[Conductor, Messages]],
    n: int,
    sampling: Sampling,
    processors: Processors,
    seed: Callable[[tuple[int | str, ...]], int],
) -> list[list[Sample]]:
    """``n`` samples for each ``(program, first-round messages)``, in one batch per grammar (``grammar_key``; one
    batch in all without a logits processor), the batch of key ``k`` seeded with ``seed(k)``."""
    by_key: dict[tuple[int | str, ...], list[int]] = {}
    for i, (conductor, _) in enumerate(prompts):
        by_key.setdefault(grammar_key(conductor) if processors.factory else (0,), []).append(i)
    out: list[list[Sample]] = [[] for _ in prompts]
    for key, members in by_key.items():
        rows = sampling.sample(
            policy,
            [prompts[i][1] for i in members],
            n,
            seed=seed(key),
            logits_processor=processors(prompts[members[0]][0], 0),
        )
        for i, row in zip(members, rows, strict=True):
            out[i] = row
    return out


@dataclass(frozen=True)
class RolloutJob:
    """One workflow to run for one example and score."""

    example: dspy.Example
    workflow: str | Workflow
    """A conductor's completion, read as the program reads its LM's, or a ``Workflow``, run as the program would
    write it (``workflow_text``); either is checked against the program's pool and limits first."""
    program: Conductor | None = None
    """The program it runs through (pool, limits, recursion); ``None``: the one ``run_and_score`` was given."""
    question: str | None = None
    """The question as the program words it; ``None``: made from the example's inputs (``question_text``)."""
    usage: Usage = field(default_factory=Usage)
    """What the conductor spent writing ``workflow``: it counts in the run like an API conductor's call."""
    ask_revision: AskRevision | None = None
    """Asked for each recursive round the workflow calls for; ``None``: the program's own conductor LM."""


@dataclass(frozen=True)
class ScoredRun:
    """What running a ``RolloutJob`` gave: the program's prediction and its reward."""

    prediction: dspy.Prediction
    reward: Reward

    def earned(self, min_reward: float) -> bool:
        """Whether the program's own workflow (no format error, so never a fallback) earned ``min_reward``."""
        return self.reward.format_ok and self.reward.value >= min_reward and self.prediction.workflow is not None


def run_and_score(
    program: Conductor,
    jobs: Sequence[RolloutJob],
    metric: Metric,
    reward: RewardConfig | None = None,
    *,
    threads: int = 8,
    thread_name_prefix: str = "rollout",
) -> list[ScoredRun]:
    """Run every job's workflow over its program's pool and score each prediction, ``threads`` jobs at once; the
    results in the jobs' order.

    A job runs through ``job.program`` or else ``program``, as given (pass ``rollout_program(program)`` so that an
    unusable workflow earns 0 without a fallback answering): its workflow is read and checked
    (``read_completion``), run with its recursive rounds (``run_reply``), and the prediction scored by ``metric`` as
    ``reward`` says (``score``; default ``RewardConfig()``), on the job's thread. A job whose example gives the
    program no question is the program's own no-answer prediction, scored alike.
    """
    reward = reward or RewardConfig()

    def run(job: RolloutJob) -> ScoredRun:
        runner = job.program or program
        question = job.question
        if question is None:
            question = runner.question_text(dict(job.example.inputs()))
        if isinstance(question, RunError):
            prediction = runner.no_answer(question)
        else:
            text = job.workflow if isinstance(job.workflow, str) else runner.workflow_text(job.workflow)
            reply = runner.read_completion(text)._replace(usage=job.usage)
            prediction = runner.run_reply(question, reply, ask_revision=job.ask_revision)
        return ScoredRun(prediction, score(job.example, prediction, metric, reward))

    with ThreadPoolExecutor(threads, thread_name_prefix=thread_name_prefix) as running:
        return list(running.map(run, jobs))
