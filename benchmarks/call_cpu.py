"""Where does a served request's CPU go: one API worker call, layer by layer.

``server_load.py`` finds the server spending 4-5 ms of CPU a two-step request against a bare Starlette app's 0.5-1.0
ms. This splits one worker call's CPU into the layers it passes through, each measured alone in this process against
the same OpenAI-compatible stub (``server_load.stub_app``, in its own process so that its CPU is not counted):

- ``aiohttp``: a POST with a shared ``aiohttp`` session, what the bare app does for each of its two calls;
- ``dspy.LM``: ``await lm.acall(request)`` on a ``dspy.LM`` over the stub, what ``LMWorker`` awaits for an API model;
- ``LMWorker``: ``worker.acomplete_step``, the above plus the library's request building and usage accounting;
- ``Executor``: a one-step ``Executor.arun``, the above plus role prompts, retries, timeouts, the ledger and trace.

Each layer sends ``--calls`` calls, ``--in-flight`` at a time, after ``--warm-up`` unmeasured ones, and reports this
process's CPU (user + system, every thread) per call; ``--repeats`` rounds give a median. A layer's figure minus the
one above it is what it adds.

    .venv/bin/python benchmarks/call_cpu.py [--calls 2000] [--in-flight 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import dspy
from server_load import serving, stub_app

from conductor.modules import Executor, LMWorker, Price, Step, WorkerPool, Workflow, chat_request

MESSAGES = [{"role": "user", "content": "What is 40 + 2?"}]


async def cpu_ms_per_call(call: Callable[[], Awaitable[object]], calls: int, in_flight: int, warm_up: int) -> float:
    """This process's CPU milliseconds per ``call()``, ``in_flight`` at a time, after ``warm_up`` unmeasured."""
    gate = asyncio.Semaphore(in_flight)

    async def gated() -> None:
        async with gate:
            await call()

    await asyncio.gather(*(gated() for _ in range(warm_up)))
    started = time.process_time()
    await asyncio.gather(*(gated() for _ in range(calls)))
    return (time.process_time() - started) * 1000 / calls


async def layers(api_base: str, args: argparse.Namespace) -> dict[str, float]:
    """Each layer's CPU per call, in the order above."""
    lm = dspy.LM("openai/gpt-4o-mini", api_base=api_base, api_key="x", cache=False, num_retries=0)
    worker = LMWorker("api", lm, price=Price())
    executor = Executor(WorkerPool([worker]))
    workflow = Workflow((Step(0, "answer"),))
    request = chat_request(lm.model, MESSAGES, max_tokens=64, temperature=0.0)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    measure = functools.partial(cpu_ms_per_call, calls=args.calls, in_flight=args.in_flight, warm_up=args.warm_up)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post() -> None:
            async with session.post(f"{api_base}/chat/completions", json=body) as response:
                await response.json()

        async def run() -> None:
            result = await executor.arun(workflow, "What is 40 + 2?")
            assert result.error is None, result.error

        return {
            "aiohttp": await measure(post),
            "dspy.LM": await measure(lambda: lm.acall(request)),
            "LMWorker": await measure(lambda: worker.acomplete_step({}, MESSAGES, max_tokens=64, temperature=0.0)),
            "Executor": await measure(run),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--warm-up", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stub-delay", type=float, default=0.02, help="seconds the stub waits before answering")
    args = parser.parse_args()
    rounds: dict[str, list[float]] = {}
    with serving(functools.partial(stub_app, args.stub_delay), 1, args.in_flight) as (stub_url, _):
        for _ in range(args.repeats):
            for layer, ms in asyncio.run(layers(f"{stub_url}/v1", args)).items():
                rounds.setdefault(layer, []).append(ms)
    print(f"{args.calls} calls a round, {args.in_flight} in flight, {args.repeats} rounds; CPU ms per call, median")
    previous = None
    for layer, values in rounds.items():
        median = statistics.median(values)
        added = f"   (+{median - previous:.2f} over the layer above)" if previous is not None else ""
        print(f"  {layer:<10}{median:6.2f}  [{min(values):.2f}-{max(values):.2f}]{added}")
        previous = median


if __name__ == "__main__":
    main()
