"""Compile a conductor on your own questions: a JSON Lines file of ``question`` and ``answer`` (no task labels, no
hand-written workflows). Program search scores candidate workflows made from the pool on the training questions,
the conductor's LoRA weights are warm-started on each question's winner, and the program that scores best on the
validation questions is saved as a folder that ``conductor run --program``, ``conductor serve`` and
``eval_on_ray.py --program`` read.

    # the embedded local pool and the SmolLM2 conductor: real models, a long run on a CPU (not timed here)
    python examples/compile_own_data.py examples/data/questions.jsonl
    # a smoke run in a minute or two: the built-in tools only and a tiny random-weight conductor
    python examples/compile_own_data.py examples/data/questions.jsonl --pool examples/data/tools_pool.yaml \\
        --conductor tiny --steps 2

Half the questions train, a quarter validate, a quarter test (a seeded split). The metric is one of the built-in
ones (``contains`` by default: the answer as whole words in the reply). The search writes its oracle table (which
workflow answered which questions) to ``OUTPUT/search/oracle.md`` and the compile its phase table to
``OUTPUT/phases.md``; running the script again with the same ``--output`` resumes. Needs the ``train`` and
``grammar`` extras (``scripts/setup.sh`` installs them) and ``data`` for reading the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import conductor
from conductor import Conductor, ConductorCompiler, WorkerPool
from conductor.bench.datasets import BUILTIN_METRICS, DataFile, split
from conductor.conductor_lm import constrain_program
from conductor.deploy import conductor_policy
from conductor.optimizers import ProgramSearchConfig, WarmStartConfig, evaluate_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="a JSONL file with `question` and `answer` on each line")
    parser.add_argument("--pool", help="a pool file (YAML or TOML; default: the embedded local pool)")
    parser.add_argument("--conductor", default="local/smollm2-135m-instruct", help="a trainable conductor LM")
    parser.add_argument("--metric", default="contains", choices=sorted(BUILTIN_METRICS))
    parser.add_argument("--steps", type=int, default=40, help="warm-start steps on the search's winners")
    parser.add_argument("--max-worker-calls", type=int, default=400, help="the most worker calls the search makes")
    parser.add_argument("--output", type=Path, default=Path("runs/own-data"), help="checkpoints and reports")
    parser.add_argument("--save", type=Path, default=Path("runs/own-data-conductor"), help="where to save the program")
    args = parser.parse_args()

    metric = BUILTIN_METRICS[args.metric]
    examples = DataFile(path=args.data).read(args.metric).examples
    train, val, test = split(examples, seed=0, fractions=(0.5, 0.25, 0.25))
    print(f"{len(examples)} questions: {len(train)} to train, {len(val)} to validate, {len(test)} to test")

    pool = WorkerPool.from_file(args.pool) if args.pool else WorkerPool.default()
    policy = conductor_policy(args.conductor)  # a local model with a fresh LoRA adapter: the weights compile trains
    # workers by name, so what it learns means the same worker in any pool; the grammar keeps every workflow valid
    program = Conductor(pool, policy.as_dspy_lm(max_tokens=128), max_steps=2, worker_ids="names")
    constrain_program(program)

    search = ProgramSearchConfig(
        samples=0,  # worker-then-checker pairs, but no sample-then-vote shapes: small models are slow
        max_worker_calls=args.max_worker_calls,
        training=WarmStartConfig(steps=args.steps, batch_size=4, lr=1e-3, max_length=2048),
    )
    compiled = ConductorCompiler(metric, output_dir=args.output, search=search).compile(
        program, trainset=train, valset=val
    )
    print((args.output / "search" / "oracle.md").read_text())
    print((args.output / "phases.md").read_text())

    folder = conductor.save(compiled, args.save)
    score = evaluate_program(compiled, test, metric).score
    print(f"Saved the compiled program to {folder}; it scores {score:.1f}% on the {len(test)} test questions")


if __name__ == "__main__":
    main()
