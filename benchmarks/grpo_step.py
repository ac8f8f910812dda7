"""Where does one GRPO step go on the CPU: conductor sampling, worker execution, or the update?

Runs GRPO steps with the real SmolLM2-135M-Instruct as the conductor (LoRA r=16 on every projection, float32) over
a scripted pool of instant workers (even ones add up right, odd ones are off by one), with the full Orchestrate
prompt, and prints each phase's seconds and the rollouts per minute. The default shape (2 examples x 4 workflows) is
the one TRL's GRPOTrainer was measured at.

The untrained model writes no parseable workflow, so every reward would be 0 and the update would have nothing to
do; by default decoding is constrained to valid workflows (``WorkflowConstraint``, needs xgrammar), so rewards vary
and the update is measured too. ``--free`` samples without the constraint.

    .venv/bin/python benchmarks/grpo_step.py [--examples 2] [--group 4] [--max-new-tokens 192] [--steps 2] [--free]
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import dspy
import torch

from conductor.conductor_lm import ConductorLM
from conductor.modules import Conductor, WorkerPool
from conductor.optimizers.grpo import GRPOConfig, GRPOTrainer
from conductor.testing import ScriptedWorker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2, help="training examples per step")
    parser.add_argument("--group", type=int, default=4, help="workflows sampled per example")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--steps", type=int, default=2, help="steps to time (the first includes warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (more is slower on a busy machine)")
    parser.add_argument("--free", action="store_true", help="sample without the workflow grammar")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    policy = ConductorLM.from_pretrained(device="cpu")
    print(f"loaded {policy!r} in {time.perf_counter() - started:.1f} s")
    pool = WorkerPool([ScriptedWorker(f"worker{i}", lambda prompt, i=i: _add(prompt, i % 2)) for i in range(4)])
    trainset = [
        dspy.Example(question=f"What is {a} + {b}?", answer=str(a + b)).with_inputs("question")
        for a, b in [(2, 2), (17, 25), (3, 9), (40, 2)]
    ]
    with tempfile.TemporaryDirectory() as folder:
        config = GRPOConfig(
            output_dir=Path(folder),
            steps=args.steps,
            batch_size=args.examples,
            group_size=args.group,
            max_new_tokens=args.max_new_tokens,
            warmup_ratio=0.0,
            progress=False,
        )
        grammar = None
        if not args.free:
            from conductor.conductor_lm import constraint_factory

            grammar = constraint_factory(policy, args.max_new_tokens)

        trainer = GRPOTrainer(
            config, policy, Conductor(pool), trainset, lambda e, p: e.answer == p.answer, logits_processor=grammar
        )
        trainer.setup()
        print(f"{'step':>4} {'sample (s)':>11} {'execute (s)':>12} {'update (s)':>11} {'checkpoint (s)':>15} "
              f"{'total (s)':>10} {'tokens':>7} {'tok/s':>6} {'rollouts/min':>13}")  # fmt: skip
        for step in range(1, args.steps + 1):
            began = time.perf_counter()
            metrics = trainer.train_step(step)
            saving = time.perf_counter()
            trainer.save_checkpoint()
            end = time.perf_counter()
            t = metrics.time_s
            print(
                f"{step:>4} {t['sample']:>11.2f} {t['execute']:>12.3f} {t['update']:>11.2f} {end - saving:>15.2f} "
                f"{end - began:>10.2f} {metrics.completion_tokens:>7} {metrics.tokens_per_s:>6.1f} "
                f"{metrics.rollouts / (end - began) * 60:>13.1f}"
            )
        trainer.cleanup()


def _add(prompt: str, error: int) -> str:
    """The sum asked in the overall task, plus ``error``."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[0])
    return str(a + b + error)


if __name__ == "__main__":
    main()
