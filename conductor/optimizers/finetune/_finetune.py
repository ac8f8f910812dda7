"""Supervised warm start of the conductor policy on valid workflows, so a small model learns the format before RL.

GRPO learns only from samples that parse, and an untrained 135M model writes about one valid workflow in 400. A short
LoRA fine-tune on workflows known to be valid (the user's, ``synthetic_workflows``, or ones that scored well during
search, ``from_predictions``: see ``_sources.py``) teaches the list format first.

Each training pair is the exact prompt the ``Conductor`` sends its LM for a question (``Conductor.prompt_messages``)
and the workflow as the program writes it (``Conductor.workflow_text``) followed by end-of-sequence. The loss is the
mean cross-entropy of the completion tokens only: teacher-forced log-probs from ``ConductorLM.sequence_logprobs``, so
the prompt is context and never a target.

Given a folder, a warm start writes a checkpoint every ``checkpoint_every`` steps and after its last (the shared
``optimizers/_checkpoint.py``), and a warm start of the same config on the same examples resumes from the newest one
there, to the same weights an uninterrupted run ends with: a run killed an hour in loses at most the steps since.

Importing this module needs no torch (making and checking examples don't); training does, through the policy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic

from conductor.errors import ConductorError
from conductor.modules import Conductor, RunError, WorkerPool, Workflow
from conductor.optimizers._optim import adamw_with_warmup, optimizer_step

if TYPE_CHECKING:
    import torch

    from conductor.conductor_lm import ConductorLM

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
    weight_decay: float = pydantic.Field(0.0, ge=0, description="AdamW's weight decay")
    max_grad_norm: float | None = pydantic.Field(1.0, gt=0, description="gradient clipping; None turns it off")
    max_length: int = pydantic.Field(1024, ge=2, description="most prompt + completion tokens of one example")
    seed: int = pydantic.Field(0, description="the seed of the batches' order (and of LoRA dropout)")
    checkpoint_every: int = pydantic.Field(
        50, ge=1, description="optimizer steps between checkpoints, when the warm start is given a folder for them"
    )


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
    trained_examples: int
    """Examples trained on, over all steps (one trained on twice counts twice)."""

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def epochs(self) -> float:
        """Passes over the examples: under 1, some were never trained on."""
        return self.trained_examples / self.examples

    def summary(self) -> str:
        """The fine-tune in a phrase: steps, epochs and how the loss moved."""
        return f"{self.steps} steps ({self.epochs:.2f} epochs, loss {self.losses[0]:.3f} -> {self.losses[-1]:.3f})"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "epochs": self.epochs}

    @classmethod
    def of(cls, history: Sequence[Mapping[str, float]], examples: int) -> WarmStartReport:
        """The report of a run whose steps are ``history`` (each step's loss, lr, tokens, examples and the seconds
        the run had taken by its end) over ``examples`` training pairs."""
        return cls(
            tuple(h["loss"] for h in history),
            tuple(h["lr"] for h in history),
            history[-1]["seconds"],
            examples,
            int(sum(h["tokens"] for h in history)),
            int(sum(h["examples"] for h in history)),
        )


# ---- training pairs ------------------------------------------------------------------------------------------------
def question_for(program: Conductor, inputs: Mapping[str, Any]) -> str:
    """The question ``program`` puts to its conductor for ``inputs``; a ``ConductorError`` when they make none."""
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
            prompt = policy.encode(seen.prompt_messages(question_for(seen, inputs)))
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
    *,
    checkpoint_dir: Path | None = None,
    progress: bool = False,
) -> WarmStartReport:
    """Fine-tune ``policy``'s trainable weights (its LoRA adapters) to write each example's workflow for the prompt
    ``program`` sends for its question (or the example's own pool): AdamW, cosine schedule with linear warmup, padded
    batches, the same result for the same seed. With ``checkpoint_dir``, checkpoints go to its ``checkpoints/`` and
    a run finds its own there and goes on from the newest; one of another config or other examples is a
    ``ConductorError``. ``progress`` draws a bar with the loss and an ETA on stderr. Don't sample from the policy in
    another thread meanwhile."""
    import torch
    from tqdm.auto import tqdm

    from conductor.optimizers._checkpoint import write_checkpoint

    config = config or WarmStartConfig()
    pairs = training_pairs(policy, program, examples, config.max_length)
    params = policy.trainable_parameters()
    if not params:
        raise ConductorError("the policy has no trainable weights")
    steps = config.steps or config.epochs * math.ceil(len(pairs) / config.batch_size)
    optimizer, schedule = adamw_with_warmup(
        params, lr=config.lr, weight_decay=config.weight_decay, steps=steps, warmup_ratio=config.warmup_ratio
    )
    fingerprint = _fingerprint(config, pairs)
    was_training = policy.model.training
    devices = [policy.device] if policy.device.type == "cuda" else []
    started = time.perf_counter()
    policy.train()
    try:
        with torch.random.fork_rng(devices=devices):  # LoRA dropout, if any, draws from a seeded generator
            torch.manual_seed(config.seed)
            # inside the fork: a checkpoint's torch RNG state is the run's, not the caller's
            history = _resume(checkpoint_dir, policy, optimizer, schedule, fingerprint)
            done, resumed = (history[-1]["seconds"] if history else 0.0), len(history)
            logger.info(
                "warm start: %d examples, %d steps of %d, from step %d", len(pairs), steps, config.batch_size, resumed
            )
            batches = _step_batches(len(pairs), config.batch_size, steps, config.seed)
            with tqdm(total=steps, initial=resumed, desc="warm start", unit="step", disable=not progress) as bar:
                for step, indices in enumerate(batches[resumed:], start=resumed):
                    lr = schedule.get_last_lr()[0]
                    row = _update(policy, [pairs[i] for i in indices], config, optimizer, schedule, params)
                    history.append(row | {"lr": lr, "seconds": done + time.perf_counter() - started})
                    logger.info("warm start step %d/%d: loss %.4f, lr %.2e", step + 1, steps, row["loss"], lr)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", refresh=False)
                    bar.update(1)
                    if checkpoint_dir is not None and (step + 1 == steps or (step + 1) % config.checkpoint_every == 0):
                        write_checkpoint(checkpoint_dir, step + 1, policy, optimizer, schedule, history, fingerprint, 1)
    finally:
        policy.train(was_training)
    report = WarmStartReport.of(history, len(pairs))
    logger.info("warm start done in %.1f s: %s", report.seconds, report.summary())
    return report


def _resume(
    checkpoint_dir: Path | None,
    policy: ConductorLM,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    fingerprint: dict[str, Any],
) -> list[dict[str, float]]:
    """Restore the newest checkpoint in ``checkpoint_dir`` of the run ``fingerprint`` names; returns the steps it
    holds (each step's loss, lr, tokens, examples and seconds so far), none without one."""
    from conductor.optimizers._checkpoint import checkpoints, read_checkpoint

    found = checkpoints(checkpoint_dir) if checkpoint_dir is not None else []
    if not found:
        return []
    return read_checkpoint(found[-1], policy, optimizer, schedule, require=fingerprint).metrics


def _update(
    policy: ConductorLM,
    chosen: Sequence[TokenPair],
    config: WarmStartConfig,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    params: list[torch.nn.Parameter],
) -> dict[str, float]:
    """One optimizer step on ``chosen``, in ``config.grad_accumulation`` micro-batches; returns its loss (mean
    cross-entropy per completion token, before the update), its completion tokens and its examples."""
    tokens = sum(len(c) for _, c in chosen)
    total = 0.0
    micro = math.ceil(len(chosen) / config.grad_accumulation)
    for start in range(0, len(chosen), micro):
        nll = completion_nll(policy, chosen[start : start + micro], grad=True)
        (nll / tokens).backward()  # token-weighted mean over the whole step, however it is split
        total += nll.item()
    optimizer_step(optimizer, schedule, params, config.max_grad_norm)
    return {"loss": total / tokens, "tokens": tokens, "examples": len(chosen)}


def _fingerprint(config: WarmStartConfig, pairs: Sequence[TokenPair]) -> dict[str, Any]:
    """What a checkpoint must share with a run to go on with it: the config (how often it checkpoints aside) and the
    very token pairs, as JSON reads them back."""
    settings = config.model_dump(exclude={"checkpoint_every"})
    examples = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()
    return json.loads(json.dumps({"warm_start": settings, "examples": examples}))
