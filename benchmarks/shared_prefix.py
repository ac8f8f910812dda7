"""What does scoring a warm-start batch after its prompts' common prefix save?

A warm-start step trains on a few questions at once; their Orchestrate prompts are the same text up to the question
near the end. ``sequence_logprobs`` then runs one pass over the shared part and scores every row after it, where a
pass per prompt would redo the shared part for each question. This times the log-probs with gradients (the step's
forward and backward) for ``--batch`` different questions both ways, on the real SmolLM2-135M-Instruct with LoRA
r=8 over the same 4-worker pool, and prints the ratio; the log-probs must agree.

    .venv/bin/python benchmarks/shared_prefix.py [--batch 4] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from conductor.conductor_lm import ConductorLM, LoraSpec
from conductor.modules import Conductor, WorkerPool
from conductor.testing import ScriptedWorker

WORKFLOW = 'model_id = [0, 2]\nsubtasks = ["Solve.", "Check."]\naccess_list = [[], "all"]'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="different questions in one warm-start step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    policy = ConductorLM.from_pretrained(device="cpu", lora=LoraSpec(r=8, alpha=16))
    program = Conductor(WorkerPool([ScriptedWorker(f"worker{i}", lambda _: "42") for i in range(4)]))
    questions = [f"What is {7 * i + 3} times {i + 11}, minus {2 * i}?" for i in range(args.batch)]
    prompts = [policy.encode(program.prompt_messages(q)) for q in questions]
    completion = policy.tokenizer(WORKFLOW, add_special_tokens=False)["input_ids"]
    completions = [completion] * args.batch

    def timed(common_prefix: bool) -> tuple[float, list[torch.Tensor]]:
        began = time.perf_counter()
        scores = policy.sequence_logprobs(prompts, completions, grad=True, common_prefix=common_prefix)
        torch.stack([s.sum() for s in scores]).sum().backward()
        policy.model.zero_grad()
        return time.perf_counter() - began, [s.detach() for s in scores]

    shared, per_prompt = [], []
    for _ in range(args.repeats):
        seconds, together = timed(common_prefix=True)
        shared.append(seconds)
        seconds, alone = timed(common_prefix=False)  # a pass per prompt
        per_prompt.append(seconds)
    drift = max((a - b).abs().max().item() for a, b in zip(together, alone, strict=True))
    columns = enumerate(zip(*prompts, strict=False))  # token by token, up to the shortest prompt
    common = next((k for k, tokens in columns if len(set(tokens)) > 1), min(map(len, prompts)))
    print(
        f"{args.batch} questions, prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens sharing "
        f"{common}, {len(completion)}-token workflows, log-probs with gradients (median of {args.repeats}):"
    )
    print(
        f"  after the common prefix {statistics.median(shared):.2f} s, a pass per prompt "
        f"{statistics.median(per_prompt):.2f} s, ratio {statistics.median(per_prompt) / statistics.median(shared):.2f}"
        f"; largest log-prob difference {drift:.1e}"
    )


if __name__ == "__main__":
    main()
