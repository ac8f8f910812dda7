"""How much faster do independent steps finish when they run side by side?

A workflow of 4 independent steps, whose scripted workers each sleep 0.2 s, plus a final step that sees them all; run
with ``max_parallel=1`` (one after another) and ``max_parallel=4``, and print the medians and their ratio.

    .venv/bin/python benchmarks/parallel_steps.py [--n 5] [--delay 0.2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from conductor.modules import Executor, Step, WorkerPool, Workflow
from conductor.testing import ScriptedWorker


def wall_s(max_parallel: int, delay_s: float, n: int) -> float:
    pool = WorkerPool([ScriptedWorker(f"w{i}", lambda _: "done", delay_s=delay_s) for i in range(4)])
    workflow = Workflow((*(Step(i, f"part {i}", ()) for i in range(4)), Step(0, "combine the parts")))
    executor = Executor(pool, max_parallel=max_parallel)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        result = executor.run(workflow, "What is the result?")
        times.append(time.perf_counter() - start)
        assert result.error is None, result.error
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--delay", type=float, default=0.2)
    args = parser.parse_args()
    sequential, parallel = wall_s(1, args.delay, args.n), wall_s(4, args.delay, args.n)
    print(f"sequential (max_parallel=1): {sequential:.3f} s")
    print(f"parallel   (max_parallel=4): {parallel:.3f} s")
    print(f"ratio sequential/parallel:   {sequential / parallel:.2f}  (ideal: 5 rounds / 2 rounds = 2.50)")


if __name__ == "__main__":
    main()
