"""Score methods on your own questions on a Ray cluster: each worker of the pool alone, a random workflow, and
optionally a saved program, every one on the same questions, the questions spread over one actor per CPU.

    # a private Ray cluster on this machine, over the built-in tools (no model to load)
    python examples/eval_on_ray.py --pool examples/data/tools_pool.yaml
    # the embedded local models (each actor loads its own), with the program compile_own_data.py saved
    python examples/eval_on_ray.py --program runs/own-data-conductor
    # a cluster you started: `ray start --head` here, `ray start --address=HEAD:6379` on the other machines
    python examples/eval_on_ray.py --ray auto

This is ``conductor bench`` from Python: the config is a dict (the shape of a bench YAML file), the results stream
into ``OUTPUT/results.jsonl`` (a run stopped half-way resumes there) and the report is ``OUTPUT/table.md`` with
``results.json`` and ``plot.png``. Needs the ``ray`` extra: ``pip install 'dspy-conductor[ray]'``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import ray

from conductor import WorkerPool
from conductor.bench import run_benchmark, validate_config, write_report
from conductor.bench.datasets import BUILTIN_METRICS


def methods(pool_names: list[str], program: Path | None) -> list[dict]:
    """What to compare: each worker alone, a random workflow of up to 2 steps, and the saved program if given."""
    compared = [{"name": f"only {name}", "type": "single", "args": {"worker": i}} for i, name in enumerate(pool_names)]
    compared.append({"name": "random workflow", "type": "random", "args": {"max_steps": 2}})
    if program is not None:
        compared.append({"name": f"program {program.name}", "type": "program", "args": {"path": str(program)}})
    return compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("examples/data/questions.jsonl"), help="JSONL questions")
    parser.add_argument("--n", type=int, default=16, help="how many of its questions (default 16)")
    parser.add_argument("--metric", default="contains", choices=sorted(BUILTIN_METRICS))
    parser.add_argument("--pool", help="a pool file (YAML or TOML; default: the embedded local pool)")
    parser.add_argument("--program", type=Path, help="a saved program folder to score as well (same pool size)")
    parser.add_argument("--ray", default="local", help="'local' (a new cluster), 'auto' or ray://HOST:10001")
    parser.add_argument("--output", type=Path, default=Path("runs/eval-on-ray"), help="results and report")
    args = parser.parse_args()

    pool = WorkerPool.from_file(args.pool) if args.pool else WorkerPool.default()  # here only for its names
    config = validate_config(
        {
            "title": f"{args.data.name} on Ray",
            "pool": args.pool or "default",
            "datasets": [
                {
                    "name": "file",
                    "args": {"path": str(args.data), "metric": args.metric},
                    "n": args.n,
                    "part": "all",  # no train/test split: score every question
                    "label": args.data.stem,
                }
            ],
            "methods": methods(pool.names, args.program),
            "output": str(args.output),
            "ray": args.ray,
        }
    )
    records = run_benchmark(config)
    paths = write_report(config, records)
    print(paths["table"].read_text())
    print(f"Scored on a Ray cluster of {ray.cluster_resources().get('CPU', 0):.0f} CPUs")  # run_benchmark connected
    print(f"Each question's record: {args.output / 'results.jsonl'}")


if __name__ == "__main__":
    main()
