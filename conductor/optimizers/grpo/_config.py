"""``GRPOConfig``: every knob of a GRPO run in one pydantic model, validated all at once.

The defaults follow the paper where it says (group-normalised advantages, clip 0.2, no KL, temperature 1, cosine
schedule with 3% warmup) and suit a LoRA adapter on a small model otherwise (the learning rate).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic

from conductor.errors import invalid_config
from conductor.optimizers._rewards import RewardConfig


class GRPOConfig(pydantic.BaseModel):
    """How one GRPO run trains the conductor; see each field's description."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    output_dir: Path = pydantic.Field(description="metrics, rollouts, the reward curve, checkpoints, the final policy")
    steps: int = pydantic.Field(200, ge=1, description="training steps: one batch of rollouts each")
    batch_size: int = pydantic.Field(4, ge=1, description="training examples per step")
    balance_by: str | None = pydantic.Field(
        None, description="an example label (e.g. 'family'): each epoch deals its values in turn, so batches mix them"
    )
    group_size: int = pydantic.Field(8, ge=2, description="workflows sampled per example (G)")
    resample_agreeing: int = pydantic.Field(
        0,
        ge=0,
        description="rounds per step that drop the groups whose rewards all agree (they carry no gradient) and sample "
        "groups of the next training examples in their place, until batch_size groups disagree (DAPO's dynamic "
        "sampling); each round costs another rollout per workflow; 0: train on the batch as drawn",
    )
    lr: float = pydantic.Field(1e-5, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = pydantic.Field(0.0, ge=0, description="AdamW's weight decay")
    schedule: Literal["cosine", "constant"] = pydantic.Field(
        "cosine", description="the learning rate after warmup: cosine decay towards 0, or constant"
    )
    warmup_ratio: float = pydantic.Field(0.03, ge=0, lt=1, description="share of optimizer steps warming up linearly")
    max_grad_norm: float | None = pydantic.Field(1.0, gt=0, description="gradient clipping; None: none")
    clip: float = pydantic.Field(0.2, gt=0, lt=1, description="PPO ratio clip epsilon")
    beta: float = pydantic.Field(0.0, ge=0, description="KL weight to the reference (see reference); 0: no KL")
    reference: Literal["base", "start"] = pydantic.Field(
        "base",
        description="what the KL term pulls the policy toward: the base model (the adapter disabled), or the policy "
        "as this run started (a warm start's adapter, kept through resumes), so GRPO stays near what the warm start "
        "learned",
    )
    updates_per_batch: int = pydantic.Field(1, ge=1, description="optimizer steps on each batch of rollouts (mu)")
    grad_accumulation: int = pydantic.Field(
        1,
        ge=1,
        description="micro-batches per optimizer step at least (memory only: the update is the same); each pass "
        "holds the activations of its share of the step's sequences",
    )
    max_sequences_per_pass: int | None = pydantic.Field(
        32,
        ge=1,
        description="a micro-batch holds at most this many sequences; a step with more (many groups that disagree) "
        "takes more micro-batches (memory only). With the SmolLM2 conductor a sequence held about 130 MB in a pass, "
        "and one pass of a whole step reached the 24 GB of a CPU machine; None: grad_accumulation alone decides",
    )
    advantage_eps: float = pydantic.Field(1e-4, gt=0, description="added to a group's reward std")
    temperature: float = pydantic.Field(1.0, gt=0, description="conductor sampling temperature")
    top_p: float = pydantic.Field(1.0, gt=0, le=1, description="nucleus sampling's probability mass; 1: all tokens")
    max_new_tokens: int = pydantic.Field(256, ge=1, description="longest workflow the conductor may write")
    randomise_pool: bool = pydantic.Field(True, description="each example sees a random k-of-n subset, shuffled")
    min_pool_size: int = pydantic.Field(1, ge=1, description="smallest k with randomise_pool")
    max_pool_size: int | None = pydantic.Field(None, ge=1, description="largest k with randomise_pool; None: n")
    max_parallel_rollouts: int = pydantic.Field(8, ge=1, description="workflows executed at once (per shard)")
    rollout_workers: int = pydantic.Field(
        1,
        ge=1,
        description="shards of a step's examples, each sampled as one batch with its own seed; with `ray`, each in "
        "its own actor (the shards decide what is sampled; where they run does not)",
    )
    ray: str | None = pydantic.Field(
        None,
        min_length=1,
        description="run the rollout shards in Ray actors on the cluster at this address ('auto', 'local', "
        "'ray://host:10001'); None: one after another in this process",
    )
    checkpoint_every: int = pydantic.Field(1, ge=1, description="steps between checkpoints (and after the last)")
    keep_checkpoints: int = pydantic.Field(2, ge=1, description="the newest checkpoints kept; older ones are removed")
    resume: bool = pydantic.Field(False, description="continue from the newest checkpoint in output_dir")
    seed: int = pydantic.Field(0, description="the seed of sampling, random pools, the data's order and torch")
    reward: RewardConfig = pydantic.Field(RewardConfig(), description="how a rollout's outcome becomes its reward")
    progress: bool = pydantic.Field(True, description="a progress bar on stderr")

    @pydantic.model_validator(mode="after")
    def _pool_sizes(self) -> GRPOConfig:
        if self.max_pool_size is not None and self.max_pool_size < self.min_pool_size:
            raise ValueError(f"max_pool_size={self.max_pool_size} is below min_pool_size={self.min_pool_size}")
        return self

    def fingerprint(self) -> dict[str, Any]:
        """The settings that decide what a run computes (not where it writes, how often it saves, how many threads
        run workflows, where the rollouts run, or whether it resumes or shows a bar): a resumed run that changes one
        of them no longer reproduces the original."""
        ignored = {
            "output_dir",
            "checkpoint_every",
            "keep_checkpoints",
            "max_parallel_rollouts",
            "ray",
            "resume",
            "progress",
        }
        return self.model_dump(mode="json", exclude=ignored)


def load_config(config: GRPOConfig | Mapping[str, Any]) -> GRPOConfig:
    """A ``GRPOConfig`` from itself or a mapping (a parsed YAML file); every problem in one ``ConfigError``."""
    if isinstance(config, GRPOConfig):
        return config
    try:
        return GRPOConfig.model_validate(dict(config))
    except pydantic.ValidationError as exc:
        raise invalid_config("invalid GRPO config", exc) from None
