"""What one GRPO step of the GPU recipe costs on a real GPU: the decode step of transformers ``generate`` and the
learner's forward and backward through a LoRA adapter, at the paper's 7B shape.

``docs/gpu_recipe.md`` estimated both from assumptions (35 ms a decode step for a group of 64 under ``generate``;
35% of peak for the update). This measures them on whatever CUDA device is at hand, with random weights in the
shape of Qwen2.5-7B-Instruct (no download: the hub is out of reach, and speed does not depend on the values):

- decode: a group of ``--group`` rows sharing one ``--prompt-tokens`` prompt (as the library's sampler shares it),
  ``generate`` forced to ``--new-tokens`` and to 16 new tokens; the difference over the extra tokens is the time of
  one decode step of the whole group, the prefill cancelled out;
- update: LoRA r=16 on the 7 projections of every layer (the recipe's adapter), forward and backward over rows of
  ``--update-tokens`` tokens, ``--update-rows`` at a time with gradient checkpointing, with a bf16 base and with a
  float32 one (TF32 matmuls, the trainer's float32 default); tokens per second, the TFLOP/s that makes at the
  recipe's 4 x parameters a token, and the seconds one step's 136,000 learner tokens (4 prompts of 2,000 shared by
  their groups, plus 256 completions of 500) would take.

Both use transformers and peft directly, the calls the library's sampler and learner wrap (``conductor.local``,
``conductor.optimizers.grpo``), so that the check needs nothing on the GPU machine beyond its own PyTorch image.
``--shape smollm2-135m --device cpu`` runs the same code small, as a smoke test.

    python benchmarks/gpu_step.py [--shape qwen2.5-7b] [--group 64] [--prompt-tokens 2000] [--new-tokens 144]
        [--update-tokens 2500] [--update-rows 4] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SHAPES: dict[str, tuple[type, type, dict]] = {
    # Qwen2.5-7B-Instruct's config.json (the paper's conductor)
    "qwen2.5-7b": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            max_position_embeddings=32768,
            rope_theta=1e6,
            tie_word_embeddings=False,
        ),
    ),
    # SmolLM2-135M-Instruct's (this project's conductor)
    "smollm2-135m": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
    ),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STEP_LEARNER_TOKENS = 4 * 2000 + 256 * 500
"""One recipe step's tokens through the learner: 4 prompts of 2,000 shared by their groups, 256 completions of 500."""


def random_model(shape: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A model of ``shape`` with random weights, made on ``device`` (7B random values on a CPU would take minutes)."""
    config_class, model_class, fields = SHAPES[shape]
    config = config_class(**fields)
    with torch.device(device):
        model = model_class(config).to(dtype)
    return model.eval()


def synchronised(device: torch.device) -> Callable[[], float]:
    """A clock that first waits for the device's queued work."""

    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    return now


def decode_step_s(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> dict:
    """Seconds of one decode step for the whole group: (time for ``new_tokens`` - time for 16) / the difference."""
    clock = synchronised(device)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt_tokens), device=device).expand(args.group, -1)

    def run(new: int) -> float:
        start = clock()
        with torch.no_grad():
            model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                min_new_tokens=new,
                max_new_tokens=new,
                pad_token_id=0,
            )
        return clock() - start

    run(16), run(args.new_tokens)  # warm-up: kernels chosen, memory pools grown to both lengths
    short, long = [], []
    for _ in range(args.repeats):  # interleaved, so that a slow spell hits both lengths
        short.append(run(16))
        long.append(run(args.new_tokens))
    extra = args.new_tokens - 16
    step = (statistics.median(long) - statistics.median(short)) / extra
    return {
        "group": args.group,
        "prompt_tokens": args.prompt_tokens,
        "step_ms": round(step * 1000, 2),
        "step_ms_of_the_fastest_runs": round((min(long) - min(short)) / extra * 1000, 2),
        "tokens_per_s": round(args.group / step),
        "seconds_16_new": [round(s, 3) for s in short],
        f"seconds_{args.new_tokens}_new": [round(s, 3) for s in long],
    }


def update_throughput(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> dict:
    """Learner tokens per second through a LoRA r=16 adapter, forward and backward, and one recipe step's seconds."""
    clock = synchronised(device)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, lora_dropout=0.0)
    base_parameters = sum(p.numel() for p in model.parameters())
    policy = get_peft_model(model, lora)  # the adapter in float32 whatever the base's dtype (peft's default)
    policy.train()
    # without it a 7B float32 base's activations for 10,000 tokens don't fit beside its weights; it costs one more
    # forward, which the FLOP count below leaves out (it counts the recipe's 4 x parameters a token)
    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rows = torch.randint(0, model.config.vocab_size, (args.update_rows, args.update_tokens), device=device)

    def one() -> float:
        start = clock()
        logits = policy(input_ids=rows).logits
        # the log-prob of each next token, as the GRPO loss takes it
        logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, rows[:, 1:, None])
        logprobs.mean().backward()
        policy.zero_grad(set_to_none=True)
        return clock() - start

    one()
    seconds = statistics.median(one() for _ in range(args.repeats))
    tokens_per_s = args.update_rows * args.update_tokens / seconds
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return {
        "rows": args.update_rows,
        "tokens_a_row": args.update_tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens_per_s),
        "lora_parameters": trainable,
        "tflops_at_4n_a_token": round(4 * base_parameters * tokens_per_s / 1e12, 1),
        "recipe_step_s": round(STEP_LEARNER_TOKENS / tokens_per_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--group", type=int, default=64, help="rows sampled together for one prompt")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=144, help="the long run's tokens (the short one makes 16)")
    parser.add_argument("--update-tokens", type=int, default=2500, help="tokens a row in the update")
    parser.add_argument("--update-rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.new_tokens <= 16:
        parser.error("--new-tokens must be above 16 (the short run's length)")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run it on a GPU machine, or pass --device cpu --shape smollm2-135m")
    torch.backends.cuda.matmul.allow_tf32 = True  # a float32 base runs its matmuls on TF32 tensor cores
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report: dict = {"device": where, "torch": torch.__version__, "shape": args.shape}
    print(f"{where}, torch {torch.__version__}, shape {args.shape}")

    model = random_model(args.shape, torch.bfloat16, device)
    report["decode_bf16"] = decode_step_s(model, args, device)
    print("decode, bf16:", report["decode_bf16"])
    report["update_bf16_base"] = update_throughput(model, args, device)
    print("update, bf16 base:", report["update_bf16_base"])
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model = random_model(args.shape, torch.float32, device)
    report["update_float32_base"] = update_throughput(model, args, device)
    print("update, float32 base:", report["update_float32_base"])
    if device.type == "cuda":
        report["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
        print("peak memory GiB:", report["peak_gib"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
