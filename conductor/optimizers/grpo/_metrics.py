"""What a GRPO run reports: a JSON line per step (``metrics.jsonl``) and per rollout (``rollouts.jsonl``), a progress
bar, and a reward curve (``reward_curve.png``).

On resume the files are cut back to the checkpoint's step, so they describe exactly the run that continues (a killed
run may have logged steps after its last checkpoint, and half a line).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from conductor.optimizers.grpo._rollouts import RolloutBatch, rewards_agree

logger = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts.jsonl"
CURVE = "reward_curve.png"


@dataclass
class StepMetrics:
    """One step's summary: rewards and their parts over every rollout it ran (those of groups dropped by resampling
    too: all were sampled from the policy), the update, the learning rate, timings."""

    step: int
    reward: float
    reward_std: float
    format_failure_rate: float
    accuracy: float
    """Mean metric value over rollouts (0 for a format error or a metric that raised)."""
    loss: float
    kl: float
    clip_fraction: float
    grad_norm: float
    lr: float
    rollouts: int
    """Every rollout the step ran, resampled ones included: what the step cost."""
    agreeing_groups: int
    """Groups whose rewards all agreed (no gradient), among all the step sampled."""
    resampled_groups: int
    """Further examples drawn to replace groups that agreed (``resample_agreeing``)."""
    completion_tokens: int
    tokens_per_s: float
    """Conductor tokens sampled per second of sampling."""
    time_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, step: int, batch: RolloutBatch, lr: float, update: dict[str, float]) -> StepMetrics:
        """Summarise ``batch``; ``update`` holds ``loss``, ``kl``, ``clip_fraction``, ``grad_norm`` and ``update_s``."""
        rewards = [r.reward for r in batch.all_rollouts]
        values = [r.value for r in rewards] or [0.0]
        return cls(
            step=step,
            reward=statistics.fmean(values),
            reward_std=statistics.pstdev(values),
            format_failure_rate=statistics.fmean([not r.format_ok for r in rewards] or [0.0]),
            accuracy=statistics.fmean([r.metric or 0.0 for r in rewards] or [0.0]),
            loss=update["loss"],
            kl=update["kl"],
            clip_fraction=update["clip_fraction"],
            grad_norm=update["grad_norm"],
            lr=lr,
            rollouts=len(rewards),
            agreeing_groups=sum(map(rewards_agree, batch.groups + batch.dropped)),
            resampled_groups=batch.resampled,
            completion_tokens=batch.completion_tokens,
            tokens_per_s=batch.completion_tokens / batch.sample_s if batch.sample_s > 0 else 0.0,
            time_s={"sample": batch.sample_s, "execute": batch.execute_s, "update": update["update_s"]},
        )


def _rewrite(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def _steps_up_to(path: Path, step: int) -> list[str]:
    """The complete lines of a JSONL file whose ``step`` is at most ``step``."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):  # half a line from a killed run
            continue
    return kept


class MetricsLog:
    """Writes the run's metrics files and drives the progress bar. ``history`` is the metrics of the steps done
    before (from a checkpoint); the files are rewritten to hold exactly those."""

    def __init__(self, output_dir: Path, total_steps: int, history: list[dict[str, Any]], *, progress: bool = True):
        self.output_dir = output_dir
        self.history = list(history)
        done = self.history[-1]["step"] if self.history else 0
        output_dir.mkdir(parents=True, exist_ok=True)
        _rewrite(output_dir / METRICS, [json.dumps(m) for m in self.history])
        _rewrite(output_dir / ROLLOUTS, _steps_up_to(output_dir / ROLLOUTS, done))
        self.bar = tqdm(total=total_steps, initial=done, desc="GRPO", unit="step", disable=not progress, leave=True)

    def log(self, metrics: StepMetrics, batch: RolloutBatch) -> None:
        """Append one step's lines (a rollout of a group that resampling replaced is marked ``dropped``) and show it
        on the progress bar."""
        record = asdict(metrics)
        self.history.append(record)
        trained = len(batch.rollouts)
        rollouts = [r.record() | {"dropped": i >= trained} for i, r in enumerate(batch.all_rollouts)]
        with (self.output_dir / ROLLOUTS).open("a") as f:
            f.writelines(json.dumps({"step": metrics.step, "rollout": i, **r}) + "\n" for i, r in enumerate(rollouts))
        with (self.output_dir / METRICS).open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.bar.set_postfix(
            reward=f"{metrics.reward:.3f}",
            format_fail=f"{metrics.format_failure_rate:.0%}",
            acc=f"{metrics.accuracy:.0%}",
            agreeing=metrics.agreeing_groups,
            resampled=metrics.resampled_groups,
            rollouts=metrics.rollouts,
            tok_s=f"{metrics.tokens_per_s:.0f}",
            refresh=False,
        )
        self.bar.update(1)

    def plot(self) -> Path | None:
        """Draw mean reward (with its spread), accuracy and format-failure rate per step; ``None`` without
        matplotlib (an optional dependency) or without steps."""
        if not self.history:
            return None
        try:
            from matplotlib.figure import Figure  # no pyplot: the caller's backend and figures stay untouched
        except ImportError:
            logger.warning("matplotlib is not installed: no reward curve (pip install matplotlib)")
            return None
        steps = [m["step"] for m in self.history]
        mean = [m["reward"] for m in self.history]
        std = [m["reward_std"] for m in self.history]
        figure = Figure(figsize=(7, 4), layout="constrained")
        axes = figure.subplots()
        axes.plot(steps, mean, label="mean reward", color="tab:blue")
        low = [m - s for m, s in zip(mean, std, strict=True)]
        high = [m + s for m, s in zip(mean, std, strict=True)]
        axes.fill_between(steps, low, high, color="tab:blue", alpha=0.15, label="± std")
        axes.plot(steps, [m["accuracy"] for m in self.history], label="accuracy", color="tab:green")
        axes.plot(steps, [m["format_failure_rate"] for m in self.history], label="format failures", color="tab:red")
        axes.set(xlabel="step", ylabel="per rollout", title="GRPO")
        axes.legend(loc="best")
        path = self.output_dir / CURVE
        tmp = path.with_name(f".{path.stem}.tmp.png")
        figure.savefig(tmp, dpi=100)
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        self.bar.close()
