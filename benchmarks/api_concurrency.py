"""How much sooner do N calls to an API worker finish side by side than one at a time?

A GRPO group of G rollouts (or N concurrent server requests) calls the same API worker N times. This sends N one-step
runs to an ``LMWorker`` over a local OpenAI-compatible stub that answers after 50 ms (``testing.openai_stub``), one
at a time and then from N threads at once (as GRPO's rollout threads do), and once more under a per-worker
``max_concurrency``; it prints the median wall times of ``--repeats`` rounds and their ratio, measured in one run.

    .venv/bin/python benchmarks/api_concurrency.py [--n 32] [--latency 0.05] [--max-concurrency 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import dspy

from conductor.modules import Executor, LMWorker, Price, Step, WorkerPool, Workflow
from conductor.testing import openai_stub


def wall_s(stub, n: int, threads: int, **limits: int) -> float:
    lm = dspy.LM("openai/stub", api_base=stub.api_base, api_key="x", cache=False, num_retries=0)
    executor = Executor(WorkerPool([LMWorker("api", lm, price=Price(1.0, 1.0), **limits)]))
    workflow = Workflow((Step(0, "answer"),))

    def run(i: int) -> None:
        result = executor.run(workflow, f"question {i} {uuid.uuid4()}")
        assert result.error is None, result.error

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(n)))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    modes = {
        "one at a time": {"threads": 1},
        "side by side": {"threads": args.n},
        f"side by side, max_concurrency={args.max_concurrency}": {
            "threads": args.n,
            "max_concurrency": args.max_concurrency,
        },
    }
    with openai_stub(args.latency) as stub:
        wall_s(stub, args.n, args.n)  # litellm sets up its clients and tokenizer on first use: not in the figures
        times = {mode: [] for mode in modes}
        for _ in range(args.repeats):  # modes interleaved, so load on the machine affects each alike
            for mode, options in modes.items():
                times[mode].append(wall_s(stub, args.n, **options))
    medians = {mode: statistics.median(runs) for mode, runs in times.items()}
    one = medians["one at a time"]
    print(f"{args.n} calls of {args.latency * 1000:.0f} ms to one API worker (median of {args.repeats}):")
    for mode, wall in medians.items():
        print(f"  {mode:<34} {wall:6.2f} s   ({one / wall:.1f}x)")


if __name__ == "__main__":
    main()
