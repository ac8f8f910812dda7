"""How many calls of one API worker can a process have in flight at once?

A served run awaits its API workers' calls on the event loop, so ``conductor serve --concurrency`` may put hundreds of
them in flight. Below the library, DSPy's LM sends them through lm15's connection pool, whose default is 100
connections and which ``dspy.LM`` has no setting for: past 100, a call waits for a connection. This sends N one-step
runs at once (``Executor.arun``, as the server does) to one ``LMWorker`` over a local OpenAI-compatible stub that
answers after ``--latency`` seconds (``testing.openai_stub``, a thread per request, which counts the most requests
it held at once), for each N in ``--in-flight``, and prints calls per second against the ideal (N / latency) and the
most the stub saw at once. Serving from more processes (``--workers``) multiplies the connections.

    .venv/bin/python benchmarks/api_connections.py [--in-flight 50 100 200 400] [--latency 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import dspy

from conductor.modules import Executor, LMWorker, Price, Step, WorkerPool, Workflow
from conductor.testing import openai_stub


async def calls_per_s(api_base: str, in_flight: int) -> float:
    """Calls a second of ``in_flight`` one-step runs sent at once, after one unmeasured run."""
    lm = dspy.LM("openai/gpt-4o-mini", api_base=api_base, api_key="x", cache=False, num_retries=0)
    executor = Executor(WorkerPool([LMWorker("api", lm, price=Price())]))
    workflow = Workflow((Step(0, "answer"),))

    async def run() -> None:
        result = await executor.arun(workflow, f"question {uuid.uuid4()}")
        assert result.error is None, result.error

    await run()
    started = time.perf_counter()
    await asyncio.gather(*(run() for _ in range(in_flight)))
    return in_flight / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[50, 100, 200, 400], metavar="N")
    parser.add_argument("--latency", type=float, default=1.0, metavar="S", help="the stub's answer time")
    args = parser.parse_args()
    print(f"{'in flight':>10}{'calls/s':>10}{'ideal':>8}{'ratio':>7}{'most at the stub':>18}")
    for in_flight in args.in_flight:
        with openai_stub(latency_s=args.latency) as stub:
            rate = asyncio.run(calls_per_s(stub.api_base, in_flight))
            ideal = in_flight / args.latency
            print(f"{in_flight:>10}{rate:10.1f}{ideal:8.1f}{rate / ideal:7.2f}{stub.most_in_flight:>18}")


if __name__ == "__main__":
    main()
