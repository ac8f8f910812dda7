"""Evaluation throughput of the experiment runner (``conductor bench``) with and without Ray, on this machine.

The same config runs twice in one run: a local SmolLM2-135M-Instruct worker (32 greedy tokens) answering SIMULATED
questions, once in this process (2 units at once, one torch thread: the model serves one call at a time) and once
sharded over a local Ray cluster of 2 CPUs (one single-thread actor per CPU, each with its own copy of the model).
Each time counts everything a user waits for, model loading and actor start included; the records of the two runs
are checked to be the same.

    .venv/bin/python benchmarks/eval_ray.py [--n 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import ray
import torch
import yaml

from conductor.bench import run_benchmark, validate_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="questions per dataset (two datasets)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False)
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        # greedy: a worker that samples (the default temperature, 0.2) draws from its process's unseeded RNG
        worker = {"name": "smollm2", "kind": "local", "model": "smollm2-135m-instruct", "max_tokens": 32}
        worker["temperature"] = 0.0
        (base / "pool.yaml").write_text(yaml.safe_dump({"workers": [worker]}))
        config = {
            "pool": "pool.yaml",
            "datasets": [{"name": "simulated", "args": {"family": f}, "n": args.n} for f in ("math500", "mmlu")],
            "methods": [{"name": "smollm2", "type": "single", "args": {"worker": 0}}],
            "threads": 2,
        }
        timings, records = {}, {}
        for mode, extra in (("one process", {}), ("Ray, 2 actors", {"ray": "auto"})):
            began = time.perf_counter()
            records[mode] = run_benchmark(
                validate_config({**config, **extra, "output": mode.replace(" ", "_")}, base_dir=base), progress=False
            )
            timings[mode] = time.perf_counter() - began
            units = len(records[mode])
            print(f"{mode:>14}: {units} units in {timings[mode]:.1f} s, {units / timings[mode]:.2f} units/s")
    strip = [[{k: v for k, v in r.items() if k != "latency_s"} for r in rs] for rs in records.values()]
    print(f"same records: {strip[0] == strip[1]}; throughput ratio (Ray / one process): "
          f"{timings['one process'] / timings['Ray, 2 actors']:.2f}x")  # fmt: skip
    ray.shutdown()


if __name__ == "__main__":
    main()
