"""How much time does the executor add to a step, over calling the same worker directly?

Runs N one-step workflows through ``Executor.run`` and N direct ``worker.complete`` calls with the same messages
(alternating, so machine load falls on both alike),
for an instant scripted worker (the overhead alone) and the real calculator tool, and prints medians and ratios.
(A local model's call takes 0.5-2 s here, so the executor's ~0.1 ms is lost in its noise; it isn't timed.)

    .venv/bin/python benchmarks/executor_overhead.py [--n 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

from conductor.modules import Executor, Step, WorkerPool, WorkerPromptAdapter, Workflow
from conductor.modules.tools import CalculatorWorker
from conductor.testing import ScriptedWorker


def measure(worker, subtask: str, n: int) -> tuple[float, float]:
    executor = Executor(WorkerPool([worker]))
    workflow = Workflow((Step(0, subtask),))
    predictor = executor.roles["solve"]
    messages = WorkerPromptAdapter().format(
        predictor.signature, [], {"question": "What is the result?", "context": "", "subtask": subtask}
    )
    direct_call = lambda: worker.complete(messages, max_tokens=worker.max_tokens, temperature=0.0)  # noqa: E731
    timings: dict[str, list[float]] = {"direct": [], "executor": []}
    for _ in range(n):  # alternate the two, so load from other processes falls on both alike
        for label, call in (
            ("direct", direct_call),
            ("executor", lambda: executor.run(workflow, "What is the result?")),
        ):
            start = time.perf_counter()
            call()
            timings[label].append(time.perf_counter() - start)
    direct, through = statistics.median(timings["direct"]), statistics.median(timings["executor"])
    return direct, through


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    print(f"{'worker':<12} {'direct (µs)':>12} {'executor (µs)':>14} {'overhead (µs)':>14} {'ratio':>7}")
    workers = [
        ("scripted", ScriptedWorker("scripted", lambda _: "42"), "Answer.", args.n),
        ("calculator", CalculatorWorker(), "Compute (17 * 23 + 4) ** 2 / 3", args.n),
    ]
    for label, worker, subtask, n in workers:
        direct, through = measure(worker, subtask, n)
        print(
            f"{label:<12} {direct * 1e6:>12.1f} {through * 1e6:>14.1f} {(through - direct) * 1e6:>14.1f} "
            f"{through / direct:>7.2f}"
        )


if __name__ == "__main__":
    main()
