"""A GRPO step with its rollouts in 2 single-thread Ray actors against the same step in one single-thread process.

The conductor is the real SmolLM2-135M-Instruct (LoRA r=16 on every projection, float32), decoding workflows of up
to 2 steps under the workflow grammar (xgrammar; ``--free`` samples without it), over a scripted pool of instant
workers (even ones add up right, odd ones are off by one), so the time is the conductor's: sampling, then the update
on the driver. One process samples the step's examples in one batch on one torch thread (``rollout_workers: 1``,
the default); on Ray the examples are split into 2 shards sampled at once by 2 actors of one thread each
(``rollout_workers: 2``), which then get the updated adapter (``ray.put``) before the next step. Each mode runs
``--steps`` steps in one run; the first step of each is the warm-up, the ratio is over the others.

    .venv/bin/python benchmarks/grpo_ray.py [--examples 4] [--group 4] [--max-new-tokens 96] [--steps 3] [--free]
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import dspy
import ray
import torch

from conductor.conductor_lm import ConductorLM
from conductor.modules import Conductor, WorkerPool
from conductor.optimizers.grpo import GRPOConfig, GRPOTrainer, RolloutSetup
from conductor.testing import ScriptedWorker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=4, help="training examples per step")
    parser.add_argument("--group", type=int, default=4, help="workflows sampled per example")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=3, help="steps per mode (the first is the warm-up)")
    parser.add_argument("--free", action="store_true", help="sample without the workflow grammar")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False)
    print(f"{'mode':>14} {'step':>4} {'sample (s)':>11} {'execute (s)':>12} {'update (s)':>11} {'total (s)':>10}")
    one = run(args, rollout_workers=1, ray_address=None)
    two = run(args, rollout_workers=2, ray_address="auto")
    print(f"mean step after warm-up: one process {one:.1f} s, 2 Ray actors {two:.1f} s; speed-up {one / two:.2f}x")
    ray.shutdown()


def run(args: argparse.Namespace, *, rollout_workers: int, ray_address: str | None) -> float:
    """Run the steps in one mode, print each; the mean total seconds of the steps after the first."""
    built = setup(args.max_new_tokens, args.free)
    mode = "one process" if ray_address is None else f"{rollout_workers} Ray actors"
    with tempfile.TemporaryDirectory() as folder:
        config = GRPOConfig(
            output_dir=Path(folder),
            steps=args.steps,
            batch_size=args.examples,
            group_size=args.group,
            max_new_tokens=args.max_new_tokens,
            warmup_ratio=0.0,
            randomise_pool=False,
            progress=False,
            rollout_workers=rollout_workers,
            ray=ray_address,
        )
        trainer = GRPOTrainer(
            config,
            built.policy,
            built.program,
            trainset(),
            built.metric,
            logits_processor=built.logits_processor,
            rollout_setup=partial(setup, args.max_new_tokens, args.free),
        )
        totals = []
        try:
            trainer.setup()
            for step in range(1, args.steps + 1):
                began = time.perf_counter()
                metrics = trainer.train_step(step)
                totals.append(time.perf_counter() - began)
                t = metrics.time_s
                print(
                    f"{mode:>14} {step:>4} {t['sample']:>11.2f} {t['execute']:>12.3f} {t['update']:>11.2f} "
                    f"{totals[-1]:>10.2f}"
                )
        finally:
            trainer.cleanup()
    return statistics.mean(totals[1:] or totals)


def setup(max_new_tokens: int, free: bool) -> RolloutSetup:
    """The policy, program, metric and grammar: on the driver, and again in each rollout actor."""
    torch.set_num_threads(1)
    policy = ConductorLM.from_pretrained(device="cpu")
    pool = WorkerPool([ScriptedWorker(f"worker{i}", partial(_add, error=i % 2)) for i in range(4)])
    grammar = None
    if not free:
        from conductor.conductor_lm import constraint_factory

        grammar = constraint_factory(policy, max_new_tokens)
    return RolloutSetup(policy, Conductor(pool, max_steps=2), _exact, grammar)


def trainset() -> list[dspy.Example]:
    pairs = [(2, 2), (17, 25), (3, 9), (40, 2), (11, 30), (6, 7), (21, 21), (5, 8)]
    return [dspy.Example(question=f"What is {a} + {b}?", answer=str(a + b)).with_inputs("question") for a, b in pairs]


def _exact(example: dspy.Example, prediction: dspy.Prediction) -> bool:
    return example.answer == prediction.answer


def _add(prompt: str, error: int) -> str:
    """The sum asked in the overall task, plus ``error``."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[0])
    return str(a + b + error)


if __name__ == "__main__":
    main()
