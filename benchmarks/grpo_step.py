"""Where does one GRPO step go on the CPU: conductor sampling, worker execution, or the update?

Runs GRPO steps with the real SmolLM2-135M-Instruct as the conductor (LoRA r=16 on every projection, float32) over
a scripted pool of instant workers (even ones add up right, odd ones are off by one), with the full Orchestrate
prompt, and prints each phase's seconds and the rollouts per minute. The default shape (2 examples x 4 workflows) is
the one TRL's GRPOTrainer was measured at.

The untrained model writes no parseable workflow, so every reward would be 0 and the update would have nothing to
do; by default decoding is constrained to valid workflows (``WorkflowConstraint``, needs xgrammar), so rewards vary
and the update is measured too. ``--free`` samples without the constraint.

Then, in the same run, what sharing each prompt within its group saves: sampling the group as G rows that share one
pass over the prompt against G left-padded copies of it, and scoring the group's log-probs with gradients (the
update's forward and backward) in one call against one call per completion; and what the preallocated (static)
cache saves over one that grows by concatenation (transformers' default), sampling the same shared group.

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
        conductor = trainer.rollouts._conductor(1, 0)
        prompt = policy.encode(conductor.prompt_messages(conductor.question_text(trainset[0].inputs())))
        processor = grammar(conductor) if grammar else None
        _compare_sharing(policy, prompt, args.group, args.max_new_tokens, processor)
        trainer.cleanup()


def _compare_sharing(policy: ConductorLM, prompt: list[int], group: int, max_new_tokens: int, processor) -> None:
    """Time one group with its prompt shared and with a copy of the prompt per completion."""
    options = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "seed": 0, "logits_processor": processor}
    began = time.perf_counter()
    samples = policy.sample([prompt], group, **options)[0]
    shared_sampling = time.perf_counter() - began
    began = time.perf_counter()
    policy.sample([prompt] * group, 1, **options)  # n=1: G left-padded rows, each with its own pass over the prompt
    copied_sampling = time.perf_counter() - began
    completions = [list(s.token_ids) for s in samples]
    began = time.perf_counter()
    policy.sample([prompt], group, **options, prompt_cache="dynamic")  # a cache that grows by concatenation
    growing_sampling = time.perf_counter() - began

    def score(calls: list[list[int]]) -> float:
        began = time.perf_counter()
        scored = [
            lp
            for c in calls
            for lp in policy.sequence_logprobs([prompt] * len(c), [completions[i] for i in c], grad=True)
        ]
        torch.stack([lp.sum() for lp in scored]).sum().backward()
        policy.model.zero_grad()
        return time.perf_counter() - began

    shared_scoring = score([list(range(group))])
    copied_scoring = score([[i] for i in range(group)])
    print(f"one group of {group} (prompt {len(prompt)} tokens, completions {sum(map(len, completions)) / group:.0f}):")
    print(f"  sampling: shared prompt {shared_sampling:.2f} s, a copy per row {copied_sampling:.2f} s, "
          f"ratio {copied_sampling / shared_sampling:.2f}")  # fmt: skip
    print(f"  sampling the shared group: preallocated cache {shared_sampling:.2f} s, growing cache "
          f"{growing_sampling:.2f} s, ratio {growing_sampling / shared_sampling:.2f}")  # fmt: skip
    print(f"  log-probs with gradients: shared prompt {shared_scoring:.2f} s, a call per completion "
          f"{copied_scoring:.2f} s, ratio {copied_scoring / shared_scoring:.2f}")  # fmt: skip


def _add(prompt: str, error: int) -> str:
    """The sum asked in the overall task, plus ``error``."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[0])
    return str(a + b + error)


if __name__ == "__main__":
    main()
