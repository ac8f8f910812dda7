"""Load time and greedy generation speed of the embedded local models.

Run it in a fresh process: the load time is that of a cold process (torch and transformers imports excluded).
With ``--fresh-cache`` the GGUF is converted again into a temporary cache, which is the first-ever load.

    .venv/bin/python benchmarks/local_models.py [--fresh-cache] [--models smollm2-135m-instruct gemma-3-270m]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import transformers  # noqa: F401 - imported up front so the load time below is the model's alone

PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-cache", action="store_true", help="convert the GGUF again, as on a new machine")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conductor-cache-") as fresh:
        if args.fresh_cache:
            os.environ["CONDUCTOR_CACHE"] = fresh
        measure(args)


def measure(args: argparse.Namespace) -> None:
    from conductor.local import load_local_model, local_worker

    print(f"torch threads: {torch.get_num_threads()}   cache: {'fresh' if args.fresh_cache else 'as found'}")
    for name in args.models:
        start = time.perf_counter()
        load_local_model(name)
        loaded = time.perf_counter() - start
        worker = local_worker(name, temperature=0.0)
        start = time.perf_counter()
        completion = worker.complete(PROMPT, max_tokens=args.tokens, temperature=0.0)
        seconds = time.perf_counter() - start
        rate = completion.output_tokens / seconds
        tokens = completion.output_tokens
        print(f"{name:<24} load {loaded:6.1f} s   {tokens} tokens in {seconds:5.2f} s = {rate:5.1f} tok/s")


if __name__ == "__main__":
    main()
