"""Where the warm start's valid workflows come from: made up (``synthetic_workflows``), known-good templates per task
family over random pools (``templated_workflows``), or a conductor's own predictions that scored
(``from_predictions``).

Each gives ``TrainingExample``s for ``warm_start`` (``_finetune.py``); none needs torch.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import dspy
import pydantic

from conductor.errors import ConductorError, ConfigError
from conductor.modules import Limits, Step, WorkerPool, Workflow
from conductor.optimizers._rewards import Metric, RewardConfig, score
from conductor.optimizers._rollouts import ScoredRun
from conductor.optimizers.finetune._finetune import TrainingExample, WarmStartConfig

logger = logging.getLogger(__name__)

_QUOTE_LIMIT = 160
"""Questions longer than this are referred to as "the overall task" in subtasks, not quoted."""

# (what the step does, subtask); "{q}" is the question. A standalone subtask makes sense without the earlier steps.
_ONLY = [
    ("answers", "Answer this question: {q} Give the final answer."),
    ("answers", "Solve step by step: {q} End with the final answer."),
    ("answers", "{q} Reply with the final answer only."),
]
_FIRST = [
    ("plans", "Write a short plan for solving: {q}"),
    ("lists the facts", "List the facts and formulas needed to answer: {q}"),
    ("breaks the task down", "Break this task into simple steps: {q}"),
    ("drafts an answer", "Solve step by step: {q}"),
]
_MIDDLE_STANDALONE = [
    ("solves independently", "Solve independently, step by step: {q}"),
    ("drafts an answer", "Work out an answer to: {q}"),
]
_MIDDLE = [
    ("follows the plan", "Follow the plan in the earlier steps and work out the answer."),
    ("checks", "Check the earlier steps for mistakes and correct them."),
    ("continues", "Carry out the next part of the plan from the earlier steps."),
    *_MIDDLE_STANDALONE,
]
_LAST_STANDALONE = [("answers", "Answer this question directly: {q} Give the final answer.")]
_LAST = [
    ("gives the final answer", "Using the earlier steps, give the final answer to: {q}"),
    ("checks and answers", "Check the earlier work and state the final answer."),
    ("combines", "Combine the earlier answers and give the final answer."),
]


def _question_text(question: str | Mapping[str, Any]) -> str:
    if isinstance(question, str):
        return question
    return "\n".join(str(v) for v in question.values())


def _synthetic_workflow(question: str, pool_size: int, max_steps: int, rng: random.Random) -> Workflow:
    quoted = " ".join(question.split())
    quoted = quoted if len(quoted) <= _QUOTE_LIMIT else "the overall task."
    n = rng.randint(1, max_steps)
    steps, plan, used = [], [], set()
    for i in range(n):
        access = rng.choice(["all", ()]) if i == 0 else "all" if rng.random() < 0.7 else ()
        if n == 1:
            choices = _ONLY
        elif i == 0:
            choices = _FIRST
        elif i == n - 1:
            choices = _LAST if access == "all" else _LAST_STANDALONE
        else:
            choices = _MIDDLE if access == "all" else _MIDDLE_STANDALONE
        what, template = rng.choice([c for c in choices if c[1] not in used] or choices)
        used.add(template)
        worker = rng.randrange(pool_size)
        steps.append(Step(worker, template.format(q=quoted), access))
        plan.append(f"Model {worker} {what}")
    reasoning = "One step is enough." if n == 1 else f"{n} steps."
    return Workflow(tuple(steps), f"{reasoning} {', then '.join(plan)}.")


def synthetic_workflows(
    pool_size: int,
    questions: Sequence[str | Mapping[str, Any]],
    *,
    max_steps: int = 4,
    seed: int = 0,
    input_field: str = "question",
) -> list[tuple[dict[str, Any], Workflow]]:
    """One valid, varied workflow per question, to teach the format when the user has none: 1..``max_steps`` steps
    on random workers, access ``"all"`` or ``[]``, subtasks made from the question, the last asking for the final
    answer. A question is a string (the input field ``input_field``) or a mapping of input fields."""
    if pool_size < 1 or max_steps < 1:
        raise ConfigError(f"pool_size and max_steps must be at least 1, got {pool_size} and {max_steps}")
    rng = random.Random(seed)
    pairs = []
    for question in questions:
        inputs = {input_field: question} if isinstance(question, str) else dict(question)
        workflow = _synthetic_workflow(_question_text(question), pool_size, max_steps, rng)
        pairs.append((inputs, workflow.validate(pool_size, Limits(max_steps=max_steps))))
    return pairs


class TemplateStep(pydantic.BaseModel):
    """One step of a workflow template: a worker by name, its subtask, and the earlier steps it sees."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    worker: str = pydantic.Field(min_length=1, description="the worker's name in the pool")
    subtask: str = pydantic.Field(min_length=1, description="what the step asks its worker to do")
    access: Literal["all"] | tuple[pydantic.NonNegativeInt, ...] = pydantic.Field(
        "all", description="the earlier steps it sees: 'all', or their indices ([] for none)"
    )


Template = Sequence[TemplateStep]
"""A workflow template: its steps."""


def template_choices(value: Template | Sequence[Template]) -> tuple[tuple[TemplateStep, ...], ...]:
    """A label's templates in order of preference, from one template (a list of steps) or a list of them."""
    return tuple(tuple(TemplateStep.model_validate(step) for step in steps) for steps in _preference_list(value))


def _preference_list(value: Any) -> list[Any]:
    """``value`` as a list of templates: a list of steps (mappings or ``TemplateStep``) is one template."""
    items = list(value)
    return items if items and isinstance(items[0], Sequence) and not isinstance(items[0], str) else [items]


def check_templates(pool: WorkerPool, templates: Mapping[str, Template | Sequence[Template]]) -> None:
    """Raise one ``ConfigError`` listing every template step on a worker ``pool`` lacks and every empty template."""
    names = pool.names
    choices = {key: template_choices(value) for key, value in templates.items()}
    problems = [
        f"template {key!r}: no worker named {step.worker!r} (the pool has {', '.join(names)})"
        for key, alternatives in choices.items()
        for steps in alternatives
        for step in steps
        if step.worker not in names
    ]
    problems += [f"template {key!r} has no steps" for key, alternatives in choices.items() if not all(alternatives)]
    if problems:
        raise ConfigError("unusable workflow templates:\n" + "\n".join(f"  {p}" for p in problems))


def templated_workflows(
    pool: WorkerPool,
    examples: Sequence[dspy.Example],
    templates: Mapping[str, Template | Sequence[Template]],
    *,
    label: str,
    pools_per_question: int = 4,
    min_pool_size: int = 1,
    seed: int = 0,
) -> list[TrainingExample]:
    """Warm-start examples from known-good workflow templates (say, the best fixed pipeline of each task family in
    an oracle table): ``preferred_workflows`` with, for every example whose ``label`` field has templates, the
    label's templates in order of preference. Examples without a template are left out; unusable templates are a
    ``ConfigError`` (``check_templates``)."""
    check_templates(pool, templates)
    choices = {key: template_choices(value) for key, value in templates.items()}
    preferences = [
        (dict(example.inputs()), choices[str(example.get(label))])
        for example in examples
        if str(example.get(label)) in choices
    ]
    return preferred_workflows(
        pool, preferences, pools_per_question=pools_per_question, min_pool_size=min_pool_size, seed=seed
    )


def preferred_workflows(
    pool: WorkerPool,
    preferences: Sequence[tuple[dict[str, Any], Sequence[tuple[TemplateStep, ...]]]],
    *,
    pools_per_question: int = 4,
    min_pool_size: int = 1,
    seed: int = 0,
) -> list[TrainingExample]:
    """Warm-start examples over random pools, so that the conductor learns workers by name, not by place: for every
    ``(inputs, alternatives)``, ``pools_per_question`` ``(inputs, workflow, pool)`` examples, each pool a random
    subset (at least ``min_pool_size`` workers) and order of ``pool``, each workflow the first of ``alternatives``
    (templates in order of preference) whose workers that pool holds, on their places in it. Alternatives on
    workers the pool lacks so teach what to do when a pool lacks the first one's; a subset no alternative fits is
    drawn again, so every question's alternatives must include one that ``pool`` itself can run."""
    names = pool.names
    rng = random.Random(seed)
    out: list[TrainingExample] = []
    for inputs, alternatives in preferences:
        for _ in range(pools_per_question):
            chosen, steps = _pool_and_template(rng, names, alternatives, min_pool_size)
            out.append((inputs, template_workflow(steps, [names[i] for i in chosen]), pool.subset(chosen)))
    return out


def template_workflow(steps: Sequence[TemplateStep], names: Sequence[str]) -> Workflow:
    """A template's steps on their workers' places in a pool whose workers are ``names``, in order."""
    place = {name: i for i, name in enumerate(names)}
    return Workflow(tuple(Step(place[s.worker], s.subtask, s.access) for s in steps))


def _pool_and_template(
    rng: random.Random, names: Sequence[str], alternatives: Sequence[tuple[TemplateStep, ...]], min_pool_size: int
) -> tuple[list[int], tuple[TemplateStep, ...]]:
    """A random subset and order of the pool's worker indices and the first template it holds the workers of. The
    whole pool holds some template's workers, so the draw ends."""
    while True:
        chosen = rng.sample(range(len(names)), rng.randint(min(len(names), min_pool_size), len(names)))
        present = {names[i] for i in chosen}
        for steps in alternatives:
            if {step.worker for step in steps} <= present:
                return chosen, steps


class TemplateWarmStartConfig(pydantic.BaseModel):
    """A warm start on ``templated_workflows``: the templates per label, how many random pools a question, and the
    fine-tune's settings."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    templates: dict[str, tuple[tuple[TemplateStep, ...], ...]] = pydantic.Field(
        description="per label value (e.g. a task family), the workflow its questions are taught (a list of steps), "
        "or several in order of preference: a pool without the first one's workers gets the next that fits"
    )
    label: str = pydantic.Field("family", description="the example field whose value picks the template")
    pools_per_question: int = pydantic.Field(4, ge=1, description="random pools (and so examples) per question")
    min_pool_size: int = pydantic.Field(1, ge=1, description="the fewest workers a random pool holds")
    seed: int = pydantic.Field(0, description="the seed that draws the random pools")
    training: WarmStartConfig = pydantic.Field(WarmStartConfig(steps=40), description="the fine-tune's settings")

    @pydantic.field_validator("templates", mode="before")
    @classmethod
    def _preference_lists(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {key: _preference_list(templates) for key, templates in value.items()}


def from_predictions(
    examples: Sequence[dspy.Example],
    predictions: Sequence[dspy.Prediction],
    metric: Metric,
    *,
    min_reward: float = 1.0,
    reward: RewardConfig | None = None,
) -> list[tuple[dict[str, Any], Workflow]]:
    """Training pairs from a ``Conductor``'s predictions (``predictions[i]`` answers ``examples[i]``; repeat an
    example for several rollouts): the workflows the conductor wrote itself (no format error, so never a fallback)
    whose reward (``score`` with ``reward``) is at least ``min_reward``. A repeated (inputs, workflow) pair is kept
    once."""
    if len(examples) != len(predictions):
        raise ConductorError(f"{len(examples)} examples but {len(predictions)} predictions")
    reward = reward or RewardConfig()
    runs = [ScoredRun(p, score(e, p, metric, reward)) for e, p in zip(examples, predictions, strict=True)]
    return kept_pairs(examples, predictions, [run.earned(min_reward) for run in runs])


def question_key(inputs: Mapping[str, Any]) -> str:
    """One question's inputs as a hashable key (their values may be lists or dicts)."""
    return repr(sorted(inputs.items()))


def kept_pairs(
    examples: Sequence[dspy.Example], predictions: Sequence[dspy.Prediction], earned: Sequence[bool]
) -> list[tuple[dict[str, Any], Workflow]]:
    """The (inputs, workflow) pairs of the predictions that ``earned`` (``from_predictions`` when the choice is
    made already), each distinct pair once."""
    pairs: list[tuple[dict[str, Any], Workflow]] = []
    seen: set[tuple[str, Workflow]] = set()
    for i, (example, prediction, keep) in enumerate(zip(examples, predictions, earned, strict=True)):
        if not keep:
            continue
        try:
            inputs = dict(example.inputs())
        except ValueError as exc:
            raise ConductorError(f"example {i} has no input fields: build it with .with_inputs(...)") from exc
        key = (question_key(inputs), prediction.workflow)
        if key not in seen:
            seen.add(key)
            pairs.append((inputs, prediction.workflow))
    logger.info("%d of %d predictions give warm-start pairs", len(pairs), len(predictions))
    return pairs
