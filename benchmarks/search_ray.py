"""Program search with and without Ray, on this machine: its questions one at a time in this process, or one per actor.

The same search runs twice in one run, each on a fresh replay store: the embedded pool (SmolLM2-135M-Instruct and
Gemma-3-270M, greedy, with the python and calculator tools) on BIG-Bench-Hard questions of two families, every
candidate of the default space on every question (one rung), once in this process (one torch thread; a question's
candidates run 8 at once, but each model generates one call at a time) and once on a local Ray cluster of 2 CPUs (one
single-thread actor per CPU, each loading its own copy of the program). Each time counts everything a user waits for,
model loading and actor start included; the two searches' outcomes are checked to be the same.

    .venv/bin/python benchmarks/search_ray.py [--n 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import ray
import torch
import yaml

from conductor.bench.datasets import load_bbh, metric
from conductor.local import local_lm
from conductor.modules import Conductor, WorkerPool
from conductor.optimizers import ProgramSearchConfig, program_search

FAMILIES = ("navigate", "multistep_arithmetic_two")
POOL = [
    # greedy: a sampled completion would differ between the two runs, and so might their scores
    {"name": "smollm2", "kind": "local", "model": "smollm2-135m-instruct", "max_tokens": 32, "temperature": 0.0},
    {"name": "gemma", "kind": "local", "model": "gemma-3-270m", "max_tokens": 64, "temperature": 0.0},
    {"name": "python", "kind": "tool", "tool": "python"},
    {"name": "calculator", "kind": "tool", "tool": "calculator"},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3, help="questions per family (two families)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    questions = [example for family in FAMILIES for example in load_bbh(family)[: args.n]]
    config = ProgramSearchConfig(first_rung=len(questions))
    ray.init(num_cpus=2, include_dashboard=False)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "pool.yaml").write_text(yaml.safe_dump({"workers": POOL}))
        timings, outcomes = {}, {}
        for mode, address in (("one process", None), ("Ray, 2 actors", "auto")):
            began = time.perf_counter()
            # the conductor LM is never called (the search runs its own workflows), but a program saves with one
            program = Conductor(WorkerPool.from_file(Path(folder) / "pool.yaml"), local_lm(), max_steps=2)
            output = Path(folder) / mode.replace(" ", "_")
            result = program_search(program, questions, metric, config, output_dir=output, ray=address)
            timings[mode] = time.perf_counter() - began
            outcomes[mode] = result.outcomes
            pairs = sum(len(row) for row in result.outcomes)
            print(
                f"{mode:>14}: {pairs} pairs, {result.cost.worker_calls} worker calls in {timings[mode]:.1f} s "
                f"({result.cost.worker_calls / timings[mode]:.2f} calls/s)"
            )
            program.pool.close()
    print(f"same outcomes: {outcomes['one process'] == outcomes['Ray, 2 actors']}; speed-up (one process / Ray): "
          f"{timings['one process'] / timings['Ray, 2 actors']:.2f}x")  # fmt: skip
    ray.shutdown()


if __name__ == "__main__":
    main()
