"""Where program search scores a question's candidates: in this process, or in one Ray actor per CPU of a cluster.

Either way a question's candidates run together over one replaying pool (``WorkerPool.replayed``), so the pairs that
open with the same step share its sample; the search's store (if any) keeps the samples for later sittings and for
every actor. In this process a question is scored as soon as it is asked for (one at a time: the candidates of a
question already run ``max_parallel`` at once); on Ray each actor loads the saved program once and scores one
question at a time, so as many questions run at once as the cluster has CPUs, and local models, which generate one
call at a time per process, use every core. A question is scored alike wherever it runs (greedy workers give the
same outcomes; sampled ones draw where they run).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import dspy

from conductor._ray import ONE_THREAD, connect, cpus, pack_folder, unpack_folder
from conductor.deploy import load_program, save_program
from conductor.modules import Conductor, ReplayStore
from conductor.optimizers._rewards import Metric, RewardConfig
from conductor.optimizers._rollouts import RolloutJob, rollout_program, run_and_score
from conductor.optimizers.finetune import template_workflow
from conductor.optimizers.search._space import Candidate


@dataclass(frozen=True)
class Outcome:
    """One candidate on one question: its score in [0, 1] and what its run cost (as if run alone)."""

    score: float
    steps: int
    tokens: int
    cost: float

    @property
    def price(self) -> tuple[float, int, int]:
        """What ties are broken by: dollars, then steps (calls), then tokens."""
        return (self.cost, self.steps, self.tokens)


@dataclass(frozen=True)
class Scored:
    """One question's candidates scored: their outcomes in the order asked for, and ``calls``/``tokens`` what the
    workers were paid for doing it (replayed answers excluded)."""

    index: int
    outcomes: list[Outcome]
    calls: int
    tokens: int


class QuestionScorer:
    """Scores questions' candidates over ``program``'s pool replayed on ``samples`` (``None``: in memory only), in this
    process: ``submit`` scores at once, ``next`` hands the result back."""

    slots = 1

    def __init__(self, program: Conductor, samples: ReplayStore | None, metric: Metric, max_parallel: int):
        self.pool = program.pool.replayed(samples)
        self.runner = rollout_program(program, self.pool)
        self.metric = metric
        self.max_parallel = max_parallel
        self._done: list[Scored] = []

    def score(self, index: int, example: dspy.Example, candidates: Sequence[Candidate]) -> Scored:
        """Run the candidates on ``example`` and score each (a wrong answer and a failed run both 0)."""
        calls, tokens = self._paid()
        jobs = [RolloutJob(example, template_workflow(c.steps, self.runner.pool.names)) for c in candidates]
        runs = run_and_score(self.runner, jobs, self.metric, RewardConfig(wrong=0.0), threads=self.max_parallel)
        outcomes = [Outcome(run.reward.value, run.reward.steps, run.reward.tokens, run.reward.cost) for run in runs]
        after = self._paid()
        return Scored(index, outcomes, after[0] - calls, after[1] - tokens)

    def _paid(self) -> tuple[int, int]:
        return sum(w.calls for w in self.pool), sum(w.tokens for w in self.pool)

    def submit(self, index: int, example: dspy.Example, candidates: Sequence[Candidate]) -> None:
        self._done.append(self.score(index, example, candidates))

    def next(self) -> Scored:
        return self._done.pop(0)

    def close(self) -> None:
        """Nothing to release: the pool is the program's own, replayed."""


class RayQuestionScorer:
    """The same on the Ray cluster at ``address``: one actor per CPU, each with its own copy of ``program`` (shipped
    as its saved folder) replayed on ``samples``; ``submit`` hands a question to an idle actor, ``next`` waits for the
    first to finish. Needs a program that saves (``conductor.save``) and a picklable metric."""

    def __init__(
        self, program: Conductor, samples: ReplayStore | None, metric: Metric, max_parallel: int, address: str
    ):
        ray = connect(address)
        from ray.util import ActorPool

        with tempfile.TemporaryDirectory(prefix="conductor-search-") as folder:
            files = ray.put(pack_folder(save_program(program, Path(folder) / "program")))
        remote = ray.remote(_SearchActor).options(**ONE_THREAD)
        self.ray = ray
        self.actors = [remote.remote(files, samples, metric, max_parallel) for _ in range(cpus(ray))]
        self.slots = len(self.actors)
        self._pool = ActorPool(self.actors)

    def submit(self, index: int, example: dspy.Example, candidates: Sequence[Candidate]) -> None:
        self._pool.submit(lambda actor, job: actor.score.remote(*job), (index, example, list(candidates)))

    def next(self) -> Scored:
        return self._pool.get_next_unordered()

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)


class _SearchActor:
    """A Ray actor: the shipped program, loaded once, scoring the questions it is handed."""

    def __init__(self, files: dict[str, bytes], samples: ReplayStore | None, metric: Metric, max_parallel: int):
        folder = unpack_folder(files)
        try:  # a saved program loads whole (its policy's weights too), so its folder can go at once
            program = load_program(folder, trust_code=True)  # saved by the search's own process
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.scorer = QuestionScorer(program, samples, metric, max_parallel)

    def score(self, index: int, example: dspy.Example, candidates: list[Candidate]) -> Scored:
        return self.scorer.score(index, example, candidates)


def question_scorer(
    program: Conductor, samples: ReplayStore | None, metric: Metric, max_parallel: int, ray: str | None
) -> QuestionScorer | RayQuestionScorer:
    """A ``QuestionScorer`` in this process, or a ``RayQuestionScorer`` on the cluster at ``ray``."""
    if ray is None:
        return QuestionScorer(program, samples, metric, max_parallel)
    return RayQuestionScorer(program, samples, metric, max_parallel, ray)
