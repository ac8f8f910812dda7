"""Supervised warm start of the conductor policy on valid workflows, so a small model learns the format before RL.

GRPO learns only from samples that parse, and an untrained 135M model writes about one valid workflow in 400. A short
LoRA fine-tune on workflows known to be valid (the user's, ``synthetic_workflows``, or ones that scored well during
search, ``from_predictions``) teaches the list format first.

Each training pair is the exact prompt the ``Conductor`` sends its LM for a question (``Conductor.prompt_messages``)
and the workflow as the program writes it (``Conductor.workflow_text``) followed by end-of-sequence. The loss is the
mean cross-entropy of the completion tokens only: teacher-forced log-probs from ``ConductorLM.sequence_logprobs``, so
the prompt is context and never a target.

Importing this module needs no torch (making and checking examples don't); training does, through the policy.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import dspy
import pydantic

from conductor._stats import wilson_interval
from conductor.errors import ConductorError, ConfigError
from conductor.modules import Conductor, Limits, RunError, Step, WorkerPool, Workflow
from conductor.optimizers._optim import adamw_with_warmup, optimizer_step
from conductor.optimizers._rewards import Metric, Reward, RewardConfig, score

if TYPE_CHECKING:
    import torch

    from conductor.conductor_lm import ConductorLM, LogitsProcessorLike

logger = logging.getLogger(__name__)

TrainingExample = tuple[Mapping[str, Any], Workflow] | tuple[Mapping[str, Any], Workflow, WorkerPool]
"""The user's input fields for one question (``{"question": ...}``) and a valid workflow for it; optionally the pool
the conductor sees for it (a subset or order of the program's, as in randomised-pool training), else the program's."""

TokenPair = tuple[list[int], list[int]]
"""Prompt token ids and completion token ids (the workflow text and end-of-sequence)."""


class WarmStartConfig(pydantic.BaseModel):
    """Hyper-parameters of the warm start. The defaults suit LoRA on a 135M model over a few hundred workflows."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    epochs: int = pydantic.Field(1, ge=1, description="passes over the examples (ignored when `steps` is set)")
    steps: int | None = pydantic.Field(None, ge=1, description="optimizer steps, cycling over the examples")
    batch_size: int = pydantic.Field(4, ge=1, description="examples per optimizer step")
    grad_accumulation: int = pydantic.Field(
        1, ge=1, description="micro-batches per optimizer step (memory only: the update is the same)"
    )
    lr: float = pydantic.Field(1e-3, gt=0, description="peak learning rate (AdamW), reached after warmup")
    warmup_ratio: float = pydantic.Field(0.1, ge=0, lt=1, description="share of optimizer steps warming up linearly")
    weight_decay: float = pydantic.Field(0.0, ge=0)
    max_grad_norm: float | None = pydantic.Field(1.0, gt=0, description="gradient clipping; None turns it off")
    max_length: int = pydantic.Field(1024, ge=2, description="most prompt + completion tokens of one example")
    seed: int = 0


@dataclass(frozen=True)
class WarmStartReport:
    """What a warm start did: the loss and learning rate of every optimizer step, and how long it took."""

    losses: tuple[float, ...]
    """Mean cross-entropy per completion token of each step's examples, before that step's update."""
    learning_rates: tuple[float, ...]
    seconds: float
    examples: int
    completion_tokens: int
    """Completion tokens trained on, over all steps."""

    @property
    def steps(self) -> int:
        return len(self.losses)


# ---- training pairs ------------------------------------------------------------------------------------------------
def _question(program: Conductor, inputs: Mapping[str, Any]) -> str:
    question = program.question_text(dict(inputs))
    if isinstance(question, RunError):
        raise ConductorError(question.message)
    return question


def completion_ids(policy: ConductorLM, program: Conductor, workflow: Workflow) -> list[int]:
    """The tokens the policy should write for ``workflow`` in ``program``: its canonical text (workers by number or
    by name, as the program names them), then end-of-sequence."""
    eos = policy.tokenizer.eos_token_id if policy.tokenizer.eos_token_id in policy.eos_ids else min(policy.eos_ids)
    return [*policy.tokenizer(program.workflow_text(workflow), add_special_tokens=False)["input_ids"], eos]


def training_pairs(
    policy: ConductorLM, program: Conductor, examples: Sequence[TrainingExample], max_length: int
) -> list[TokenPair]:
    """Token pairs for ``examples``, after checking every one; raises ``ConductorError`` listing each unusable
    example (not an example, missing inputs, a workflow its pool can't run, too long)."""
    if not examples:
        raise ConductorError("the warm start needs at least one (inputs, Workflow) example; got none")
    problems: list[str] = []
    pairs: list[TokenPair] = []
    for i, example in enumerate(examples):
        if not (
            isinstance(example, tuple)
            and len(example) in (2, 3)
            and isinstance(example[1], Workflow)
            and (len(example) == 2 or isinstance(example[2], WorkerPool))
        ):
            problems.append(f"example {i}: not an (inputs, Workflow[, WorkerPool]) tuple: {type(example).__name__}")
            continue
        inputs, workflow, *pool = example
        seen = program.copy_with(pool=pool[0]) if pool else program
        found = [f"example {i}: {p}" for p in seen.workflow_problems(workflow)]
        try:
            prompt = policy.encode(seen.prompt_messages(_question(seen, inputs)))
        except ConductorError as exc:
            found.append(f"example {i}: {exc}")
        if found:
            problems += found
            continue
        completion = completion_ids(policy, seen, workflow)
        if len(prompt) + len(completion) > max_length:
            problems.append(
                f"example {i}: {len(prompt) + len(completion)} tokens (prompt {len(prompt)} + workflow "
                f"{len(completion)}) exceed max_length={max_length}"
            )
            continue
        pairs.append((prompt, completion))
    if problems:
        raise ConductorError(
            f"{len(problems)} problem(s) in the warm-start examples:\n" + "\n".join(f"  {p}" for p in problems)
        )
    return pairs


def completion_nll(policy: ConductorLM, pairs: Sequence[TokenPair], *, grad: bool = False) -> torch.Tensor:
    """Summed negative log-likelihood of each pair's completion given its prompt (a scalar; with a graph to the
    trainable weights when ``grad``). Prompt tokens condition the completion but are never predicted."""
    import torch

    logprobs = policy.sequence_logprobs([p for p, _ in pairs], [c for _, c in pairs], grad=grad)
    return -torch.cat(logprobs).sum()


# ---- training ------------------------------------------------------------------------------------------------------
def _step_batches(n: int, per_step: int, steps: int, seed: int) -> list[list[int]]:
    """Example indices for each optimizer step: a fresh shuffle per epoch, cut into groups of ``per_step``."""
    rng = random.Random(seed)
    batches: list[list[int]] = []
    while len(batches) < steps:
        order = list(range(n))
        rng.shuffle(order)
        batches += [order[i : i + per_step] for i in range(0, n, per_step)]
    return batches[:steps]


def warm_start(
    policy: ConductorLM,
    program: Conductor,
    examples: Sequence[TrainingExample],
    config: WarmStartConfig | None = None,
) -> WarmStartReport:
    """Fine-tune ``policy``'s trainable weights (its LoRA adapters) to write each example's workflow for the prompt
    ``program`` sends for its question (or the example's own pool): AdamW, cosine schedule with linear warmup, padded
    batches, the same result for the same seed. Don't sample from the policy in another thread meanwhile."""
    import torch

    config = config or WarmStartConfig()
    pairs = training_pairs(policy, program, examples, config.max_length)
    params = policy.trainable_parameters()
    if not params:
        raise ConductorError("the policy has no trainable weights")
    steps = config.steps or config.epochs * math.ceil(len(pairs) / config.batch_size)
    optimizer, schedule = adamw_with_warmup(
        params, lr=config.lr, weight_decay=config.weight_decay, steps=steps, warmup_ratio=config.warmup_ratio
    )
    losses: list[float] = []
    learning_rates: list[float] = []
    trained_tokens = 0
    was_training = policy.model.training
    devices = [policy.device] if policy.device.type == "cuda" else []
    started = time.perf_counter()
    logger.info("warm start: %d examples, %d steps of %d", len(pairs), steps, config.batch_size)
    policy.train()
    try:
        with torch.random.fork_rng(devices=devices):  # LoRA dropout, if any, draws from a seeded generator
            torch.manual_seed(config.seed)
            for step, indices in enumerate(_step_batches(len(pairs), config.batch_size, steps, config.seed)):
                chosen = [pairs[i] for i in indices]
                tokens = sum(len(c) for _, c in chosen)
                total = 0.0
                micro = math.ceil(len(chosen) / config.grad_accumulation)
                for start in range(0, len(chosen), micro):
                    nll = completion_nll(policy, chosen[start : start + micro], grad=True)
                    (nll / tokens).backward()  # token-weighted mean over the whole step, however it is split
                    total += nll.item()
                learning_rates.append(schedule.get_last_lr()[0])
                optimizer_step(optimizer, schedule, params, config.max_grad_norm)
                losses.append(total / tokens)
                trained_tokens += tokens
                logger.info(
                    "warm start step %d/%d: loss %.4f, lr %.2e", step + 1, steps, losses[-1], learning_rates[-1]
                )
    finally:
        policy.train(was_training)
    seconds = time.perf_counter() - started
    logger.info("warm start done in %.1f s: loss %.4f -> %.4f", seconds, losses[0], losses[-1])
    return WarmStartReport(tuple(losses), tuple(learning_rates), seconds, len(pairs), trained_tokens)


# ---- where valid workflows come from -------------------------------------------------------------------------------
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
    worker: str = pydantic.Field(min_length=1)
    subtask: str = pydantic.Field(min_length=1)
    access: Literal["all"] | tuple[pydantic.NonNegativeInt, ...] = "all"


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
    an oracle table), over random pools so that the conductor learns workers by name, not by place: for every
    example whose ``label`` field has templates, ``pools_per_question`` ``(inputs, workflow, pool)`` examples, each
    pool a random subset (at least ``min_pool_size`` workers) and order of ``pool``, each workflow the first of the
    label's templates (in order of preference) whose workers that pool holds, on their places in it. A label with
    several templates so teaches what to do when a pool lacks the first one's workers; a subset no template fits is
    drawn again. Examples without a template are left out; unusable templates are a ``ConfigError``
    (``check_templates``)."""
    check_templates(pool, templates)
    choices = {key: template_choices(value) for key, value in templates.items()}
    names = pool.names
    rng = random.Random(seed)
    out: list[TrainingExample] = []
    for example in examples:
        alternatives = choices.get(str(example.get(label)))
        if alternatives is None:
            continue
        for _ in range(pools_per_question):
            chosen, steps = _pool_and_template(rng, names, alternatives, min_pool_size)
            place = {names[i]: position for position, i in enumerate(chosen)}
            workflow = Workflow(tuple(Step(place[s.worker], s.subtask, s.access) for s in steps))
            out.append((dict(example.inputs()), workflow, pool.subset(chosen)))
    return out


def _pool_and_template(
    rng: random.Random, names: Sequence[str], alternatives: Sequence[tuple[TemplateStep, ...]], min_pool_size: int
) -> tuple[list[int], tuple[TemplateStep, ...]]:
    """A random subset and order of the pool's worker indices and the first template it holds the workers of. The
    whole pool holds every template's workers (``check_templates``), so the draw ends."""
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
    seed: int = 0
    training: WarmStartConfig = WarmStartConfig(steps=40)

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
    results = [score(e, p, metric, reward) for e, p in zip(examples, predictions, strict=True)]
    return _kept_pairs(
        examples, predictions, [_earned(p, r, min_reward) for p, r in zip(predictions, results, strict=True)]
    )


def _earned(prediction: dspy.Prediction, result: Reward, min_reward: float) -> bool:
    """Whether a prediction's own workflow (no format error, so never a fallback) earned ``min_reward``."""
    return result.format_ok and result.value >= min_reward and prediction.workflow is not None


def _question_key(inputs: Mapping[str, Any]) -> str:
    """One question's inputs as a hashable key (their values may be lists or dicts)."""
    return repr(sorted(inputs.items()))


def _kept_pairs(
    examples: Sequence[dspy.Example], predictions: Sequence[dspy.Prediction], earned: Sequence[bool]
) -> list[tuple[dict[str, Any], Workflow]]:
    """The (inputs, workflow) pairs of the predictions that ``earned``, each distinct pair once."""
    pairs: list[tuple[dict[str, Any], Workflow]] = []
    seen: set[tuple[str, Workflow]] = set()
    for i, (example, prediction, keep) in enumerate(zip(examples, predictions, earned, strict=True)):
        if not keep:
            continue
        try:
            inputs = dict(example.inputs())
        except ValueError as exc:
            raise ConductorError(f"example {i} has no input fields: build it with .with_inputs(...)") from exc
        key = (_question_key(inputs), prediction.workflow)
        if key not in seen:
            seen.add(key)
            pairs.append((inputs, prediction.workflow))
    logger.info("%d of %d predictions give warm-start pairs", len(pairs), len(predictions))
    return pairs


# ---- expert iteration: the policy's own successes ------------------------------------------------------------------
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
    temperature: float = pydantic.Field(1.0, gt=0)
    max_new_tokens: int = pydantic.Field(256, ge=1, description="most tokens of a sampled workflow")
    max_parallel_rollouts: int = pydantic.Field(8, ge=1, description="sampled workflows run at once over the pool")
    seed: int = 0
    warm_start: WarmStartConfig = WarmStartConfig(steps=40)


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
    questions = [_question(program, example.inputs()) for example in trainset]
    rows = policy.sample(
        [program.prompt_messages(q) for q in questions],
        config.samples,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        seed=config.seed,
        logits_processor=logits_processor,
    )
    jobs = [(example, q, s.text) for example, q, row in zip(trainset, questions, rows, strict=True) for s in row]
    runner = program.copy_with()
    runner.fallback = "none"  # an unusable workflow is never kept: running the fallback for it would be wasted

    def run(job: tuple[dspy.Example, str, str]) -> dspy.Prediction:
        _, question, text = job
        return runner.run_reply(question, runner.read_completion(text))

    with ThreadPoolExecutor(config.max_parallel_rollouts) as threads:
        predictions = list(threads.map(run, jobs))
    labels: dict[str, list[int]] = {}
    for i, (example, _, _) in enumerate(jobs):
        labels.setdefault("all" if config.balance_by is None else str(example.get(config.balance_by)), []).append(i)
    reward = RewardConfig()
    earned = [
        _earned(p, score(job[0], p, metric, reward), config.min_reward)
        for job, p in zip(jobs, predictions, strict=True)
    ]
    right, kept = {}, {}
    for label, members in labels.items():
        right[label] = sum(earned[i] for i in members) / len(members)
        chosen = [earned[i] for i in members]
        if config.keep == "above_base_rate":
            shapes = [_shape(runner, predictions[i]) for i in members]
            better = _above_base_rate(shapes, chosen)
            chosen = [keep and shape in better for keep, shape in zip(chosen, shapes, strict=True)]
        kept[label] = _kept_pairs([jobs[i][0] for i in members], [predictions[i] for i in members], chosen)
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


def _spread_over_questions(
    pairs: Sequence[tuple[dict[str, Any], Workflow]], n: int, rng: random.Random
) -> list[tuple[dict[str, Any], Workflow]]:
    """``n`` of ``pairs``, one question's at a time in turn (each question's in a random order), cycled when fewer.

    A question the policy already answers keeps many distinct workflows (their subtasks differ): taken in order,
    a label's share went to its first question alone, and the warm start taught one question's wording."""
    by_question: dict[str, list[tuple[dict[str, Any], Workflow]]] = {}
    for pair in pairs:
        by_question.setdefault(_question_key(pair[0]), []).append(pair)
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
