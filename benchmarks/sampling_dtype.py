"""Sampling in bfloat16 for a float32 learner: how much faster, and how far its log-probs drift.

Loads the real SmolLM2-135M-Instruct as the conductor twice with the same LoRA adapter (r=16 on every projection,
float32, its B matrices set to small random values so that the adapter changes the model): one policy samples in
float32, the other with ``sampling_dtype="bfloat16"`` (a bf16 copy with the adapter merged in). Both sample groups
of G workflows for the full Orchestrate prompt under the workflow grammar (``--free``: without it), one torch
thread, the two interleaved so that load from other processes hits both alike, and it prints tokens/s of each.
bf16 is fast only where the CPU has bf16 instructions (AVX512_BF16, AMX) or on a GPU; the first line says which.

Then the drift, on every bf16-sampled token: its log-prob as the bf16 sampler recorded it (what GRPO's old log-probs
would be) against its log-prob under the float32 learner (one teacher-forced pass with the same grammar mask
replayed), per token and per sequence, and the importance ratios ``exp(logp_f32 - logp_bf16)``: their spread and
the share outside GRPO's clip range. The same comparison for the float32 sampler checks the method (about 1e-5).

    .venv/bin/python benchmarks/sampling_dtype.py [--group 8] [--max-new-tokens 192] [--repeats 2] [--free]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dspy
import torch

from conductor.conductor_lm import ConductorLM, constrain_for
from conductor.local import Sample
from conductor.modules import Conductor, WorkerPool
from conductor.testing import ScriptedWorker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=8, help="workflows sampled per call (G)")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per dtype (seeds 0..repeats-1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (more is slower on a busy machine)")
    parser.add_argument("--clip", type=float, default=0.2, help="GRPO's ratio clip epsilon")
    parser.add_argument("--lora-std", type=float, default=0.02, help="std of the random LoRA B weights")
    parser.add_argument("--free", action="store_true", help="sample without the workflow grammar")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU kernels {torch.backends.cpu.get_cpu_capability()}, {_bf16_support()}")

    f32 = ConductorLM.from_pretrained(device="cpu")
    bf16 = ConductorLM.from_pretrained(device="cpu", sampling_dtype="bfloat16")
    pool = WorkerPool([ScriptedWorker(f"worker{i}") for i in range(4)])
    conductor = Conductor(pool)
    question = dspy.Example(question="What is 17 + 25?").with_inputs("question")
    prompt = f32.encode(conductor.prompt_messages(conductor.question_text(question.inputs())))

    def grammar() -> Any:
        return None if args.free else constrain_for(f32, len(pool), conductor.limits.max_steps, args.max_new_tokens)

    options = {"max_new_tokens": args.max_new_tokens, "temperature": 1.0}
    started = time.perf_counter()
    for policy in (f32, bf16):  # warm-up: the grammar's compilation, the bf16 copy
        policy.sample([prompt], 2, max_new_tokens=4, seed=0, logits_processor=grammar())
    print(f"prompt {len(prompt)} tokens; warm-up (grammar, bf16 copy) {time.perf_counter() - started:.1f} s")
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # the adapter changes, as in an optimizer step
        torch.manual_seed(0)
        for name, weight in f32.model.named_parameters():
            if weight.requires_grad and "lora_B" in name:
                weight.normal_(0.0, args.lora_std)
    bf16.model.load_state_dict(f32.model.state_dict())
    began = time.perf_counter()
    bf16.sampling_model()
    print(f"bringing the bf16 copy up to date after the adapter changed: {time.perf_counter() - began:.2f} s")

    timings: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    tokens: dict[str, int] = {"float32": 0, "bfloat16": 0}
    samples: dict[str, list[Sample]] = {"float32": [], "bfloat16": []}
    for seed in range(args.repeats):
        for label, policy in (("float32", f32), ("bfloat16", bf16)):
            processor = grammar()
            began = time.perf_counter()
            group = policy.sample([prompt], args.group, seed=seed, logits_processor=processor, **options)[0]
            timings[label].append(time.perf_counter() - began)
            tokens[label] += sum(len(s.token_ids) for s in group)
            samples[label] += group
    speed = {label: tokens[label] / sum(timings[label]) for label in timings}
    for label in timings:
        calls = ", ".join(f"{t:.1f}" for t in timings[label])
        print(f"{label:>8}: {tokens[label]} tokens in {calls} s: {speed[label]:.1f} tokens/s")

    for label in ("float32", "bfloat16"):
        learner = [_learner_logprobs(f32, s, grammar) for s in samples[label]]
        _report_drift(f"{label} sampler vs float32 learner", samples[label], learner, args.clip)
    print(f"bfloat16 / float32 sampling speed: {speed['bfloat16'] / speed['float32']:.2f}x")


def _bf16_support() -> str:
    """Whether the CPU has bfloat16 instructions: without them (AVX2 only) torch emulates bf16 matmuls, slowly."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next(line for line in lines if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "bf16 instructions unknown"
    found = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"bf16 instructions: {', '.join(found) or 'none'}"


def _learner_logprobs(policy: ConductorLM, sample: Sample, grammar: Callable[[], Any]) -> torch.Tensor:
    """``sample``'s token log-probs under ``policy``'s own model in one teacher-forced pass, with the mask of a fresh
    grammar replayed token by token (the distribution the sampler drew from, recomputed by the learner)."""
    prompt, completion = list(sample.prompt_ids), list(sample.token_ids)
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt + completion[:-1]])).logits[0, len(prompt) - 1 :].float()
    processor = grammar()
    if processor is not None:
        for t in range(len(completion)):
            ids = torch.tensor([prompt + completion[:t]])
            logits[t : t + 1] = processor(ids, logits[t : t + 1].clone())
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def _report_drift(title: str, samples: Sequence[Sample], learner: Sequence[torch.Tensor], clip: float) -> None:
    sampled = [torch.tensor(s.logprobs) for s in samples]
    diffs = torch.cat([new - old for new, old in zip(learner, sampled, strict=True)])
    sums = torch.stack([(new - old).sum() for new, old in zip(learner, sampled, strict=True)])
    ratios = diffs.exp()
    outside = ((ratios < 1 - clip) | (ratios > 1 + clip)).float().mean().item()
    print(f"{title} ({len(samples)} sequences, {diffs.numel()} tokens):")
    print(f"  per-token |logp diff|: mean {diffs.abs().mean():.2e}, max {diffs.abs().max():.2e}")
    print(f"  per-sequence |sum diff|: mean {sums.abs().mean():.2e}, max {sums.abs().max():.2e}")
    print(
        f"  token ratio exp(f32 - sampler): mean {ratios.mean():.4f}, std {ratios.std():.4f}, min {ratios.min():.4f}, "
        f"max {ratios.max():.4f}; outside [{1 - clip:.1f}, {1 + clip:.1f}]: {outside:.2%}"
    )
    print(f"  sequence ratio exp(sum diff): min {sums.exp().min():.4f}, max {sums.exp().max():.4f}")


if __name__ == "__main__":
    main()
