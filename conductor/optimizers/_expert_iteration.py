"""Expert iteration: sample workflows from the conductor policy, keep the ones that scored, and warm-start the policy
on them, the same number per label (task family), spread over its questions.

It samples, runs and scores through the optimizers' rollout loop (``_rollouts.py``), as GRPO does, and fine-tunes
with ``warm_start``. Importing this module needs no torch; sampling and training do, through the policy.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import dspy
import pydantic

from conductor._stats import wilson_interval
from conductor.errors import ConductorError
from conductor.modules import Conductor, Workflow
from conductor.optimizers._rewards import Metric, RewardConfig
from conductor.optimizers._rollouts import (
    Processors,
    RolloutJob,
    Sampling,
    ScoredRun,
    rollout_program,
    run_and_score,
    sample_workflows,
)
from conductor.optimizers.finetune import (
    WarmStartConfig,
    WarmStartReport,
    kept_pairs,
    question_for,
    question_key,
    warm_start,
)

if TYPE_CHECKING:
    from conductor.conductor_lm import ConductorLM, LogitsProcessorLike

logger = logging.getLogger(__name__)


class ExpertIterationConfig(pydantic.BaseModel):
    """Hyper-parameters of ``expert_iteration``. The defaults are those of the 3-family learning test
    (``tests/optimizers/test_grpo_learning.py``, with ``balance_by="family"``, and ``samples=16`` over its 8 questions
    a family), where they took SmolLM2 from sampling one family's right workflow 2 times in 100 to a start GRPO could
    finish from."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    samples: int = pydantic.Field(32, ge=1, description="workflows sampled per training question")
    balance_by: str | None = pydantic.Field(
        None,
        description="an example field (e.g. the task family) whose labels each get `per_label` kept workflows, "
        "cycled when fewer were kept; None trains on every kept workflow once, which lets the label that scores "
        "most often dominate (in the learning test, 90 of 103 kept workflows were one family's)",
    )
    per_label: int = pydantic.Field(
        8, ge=1, description="kept workflows trained on per label, with `balance_by`, taken from its questions in turn"
    )
    min_reward: float = pydantic.Field(1.0, description="the reward a workflow must earn to be kept")
    keep: Literal["earned", "above_base_rate"] = pydantic.Field(
        "earned",
        description="'earned': every workflow that earned `min_reward`; 'above_base_rate': only those whose shape "
        "(workers by name and access lists, subtasks aside) earned it more often, over the label's samples, than the "
        "label's samples as a whole, with 95% confidence (the Wilson interval's low end above the label's share): on "
        "a family the workers answer at chance, a workflow that scored once is noise",
    )
    temperature: float = pydantic.Field(1.0, gt=0, description="the conductor's sampling temperature")
    max_new_tokens: int = pydantic.Field(256, ge=1, description="most tokens of a sampled workflow")
    max_parallel_rollouts: int = pydantic.Field(8, ge=1, description="sampled workflows run at once over the pool")
    seed: int = pydantic.Field(0, description="the seed of the sampling and of the order workflows are trained in")
    warm_start: WarmStartConfig = pydantic.Field(
        WarmStartConfig(steps=40), description="the fine-tune on the kept workflows"
    )


@dataclass(frozen=True)
class ExpertIterationReport:
    """What ``expert_iteration`` sampled, kept and trained on."""

    right: dict[str, float]
    """Per label (``"all"`` without ``balance_by``): the share of sampled workflows that earned ``min_reward``, the
    policy's score before the warm start."""
    kept: dict[str, int]
    """Per label: the distinct (question, workflow) pairs kept."""
    warm_start: WarmStartReport | None
    """The fine-tune on the kept workflows; ``None`` when none was kept."""


def expert_iteration(
    policy: ConductorLM,
    program: Conductor,
    trainset: Sequence[dspy.Example],
    metric: Metric,
    config: ExpertIterationConfig | None = None,
    *,
    logits_processor: LogitsProcessorLike | None = None,
) -> ExpertIterationReport:
    """Sample ``samples`` workflows per training question from ``policy`` (under ``logits_processor``, e.g. the
    workflow grammar), run each over ``program``'s pool, keep the ones that earned ``min_reward`` (all of them, or with
    ``keep="above_base_rate"`` only shapes that beat their label's base rate) and ``warm_start`` the policy on them,
    the same number per label, spread over its questions.

    For pools where the right workflow is rare at first: GRPO learns only from groups that hold both a better and a
    worse workflow, so a family whose right workflow the policy samples a few times in a hundred teaches it nothing,
    while expert iteration keeps those few. Labels that kept nothing are left out with a warning; if none did,
    nothing is trained (the report says so). It samples over the program's own pool: over random pools (tried in
    ``experiments/results/orchestration/expert_random_pools``) it kept 6 workflows of 240, too few to learn workers
    by name; ``templated_workflows`` teaches random pools instead."""
    config = config or ExpertIterationConfig()
    if not trainset:
        raise ConductorError("expert iteration needs at least one training question; got none")
    runner = rollout_program(program)  # an unusable workflow is never kept: running the fallback for it is wasted
    jobs, runs = _sample_and_run(policy, runner, trainset, metric, config, logits_processor)
    right, kept = _kept_per_label(runner, jobs, runs, config)
    missing = [label for label, pairs in kept.items() if not pairs]
    if missing:
        logger.warning("expert iteration: no sampled workflow was kept for %s", ", ".join(missing))
    if config.balance_by is None:
        pairs = kept["all"]
    else:
        rng = random.Random(config.seed)
        pairs = [pair for found in kept.values() for pair in _spread_over_questions(found, config.per_label, rng)]
    report = warm_start(policy, program, pairs, config.warm_start) if pairs else None
    return ExpertIterationReport(right, {label: len(found) for label, found in kept.items()}, report)


def _sample_and_run(
    policy: ConductorLM,
    runner: Conductor,
    trainset: Sequence[dspy.Example],
    metric: Metric,
    config: ExpertIterationConfig,
    logits_processor: LogitsProcessorLike | None,
) -> tuple[list[RolloutJob], list[ScoredRun]]:
    """``config.samples`` workflows sampled for each training question in one batch, each run through ``runner`` and
    scored with the default reward: the rollout loop (``_rollouts.py``) with one pool, one grammar and one seed."""
    questions = [question_for(runner, example.inputs()) for example in trainset]
    rows = sample_workflows(
        policy,
        [(runner, runner.prompt_messages(q)) for q in questions],
        config.samples,
        Sampling(config.max_new_tokens, config.temperature),
        Processors(None if logits_processor is None else lambda conductor, depth: logits_processor),
        lambda key: config.seed,
    )
    jobs = [
        RolloutJob(example, sample.text, question=question)
        for example, question, row in zip(trainset, questions, rows, strict=True)
        for sample in row
    ]
    return jobs, run_and_score(runner, jobs, metric, RewardConfig(), threads=config.max_parallel_rollouts)


def _kept_per_label(
    runner: Conductor, jobs: Sequence[RolloutJob], runs: Sequence[ScoredRun], config: ExpertIterationConfig
) -> tuple[dict[str, float], dict[str, list[tuple[dict[str, Any], Workflow]]]]:
    """Per label (``"all"`` without ``balance_by``): the share of its runs that earned ``min_reward``, and the distinct
    (inputs, workflow) pairs kept by ``config.keep``."""
    labels: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        labels.setdefault("all" if config.balance_by is None else str(job.example.get(config.balance_by)), []).append(i)
    earned = [run.earned(config.min_reward) for run in runs]
    right, kept = {}, {}
    for label, members in labels.items():
        right[label] = sum(earned[i] for i in members) / len(members)
        chosen = [earned[i] for i in members]
        if config.keep == "above_base_rate":
            shapes = [_shape(runner, runs[i].prediction) for i in members]
            better = _above_base_rate(shapes, chosen)
            chosen = [keep and shape in better for keep, shape in zip(chosen, shapes, strict=True)]
        kept[label] = kept_pairs([jobs[i].example for i in members], [runs[i].prediction for i in members], chosen)
    return right, kept


def _spread_over_questions(
    pairs: Sequence[tuple[dict[str, Any], Workflow]], n: int, rng: random.Random
) -> list[tuple[dict[str, Any], Workflow]]:
    """``n`` of ``pairs``, one question's at a time in turn (each question's in a random order), cycled when fewer.

    A question the policy already answers keeps many distinct workflows (their subtasks differ): taken in order,
    a label's share went to its first question alone, and the warm start taught one question's wording."""
    by_question: dict[str, list[tuple[dict[str, Any], Workflow]]] = {}
    for pair in pairs:
        by_question.setdefault(question_key(pair[0]), []).append(pair)
    for found in by_question.values():
        rng.shuffle(found)
    in_turn = [pair for turn in itertools.zip_longest(*by_question.values()) for pair in turn if pair is not None]
    return list(itertools.islice(itertools.cycle(in_turn), n))


Shape = tuple[tuple[str, Any], ...]


def _shape(program: Conductor, prediction: dspy.Prediction) -> Shape:
    workflow = prediction.get("workflow")
    return workflow.shape(program.pool.names) if workflow is not None else ()


def _above_base_rate(shapes: Sequence[Shape], earned: Sequence[bool]) -> set[Shape]:
    """The shapes that earned more often than all of ``shapes`` together, with 95% confidence: the low end of their
    Wilson interval above the share of ``earned``."""
    base = sum(earned) / len(earned)
    tried = Counter(shapes)
    scored = Counter(shape for shape, keep in zip(shapes, earned, strict=True) if keep)
    better = {shape for shape, n in scored.items() if wilson_interval(n, tried[shape])[0] > base}
    logger.info("expert iteration: %d of %d earning shapes beat the base rate %.3f", len(better), len(scored), base)
    return better
