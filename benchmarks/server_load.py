"""How much time does the HTTP server add to a request, over the workers' own time?

Serves a scripted program with ``conductor.deploy.create_app`` under uvicorn on 127.0.0.1 (a free port, loopback
only): the conductor LM answers at once with a two-step workflow, and each worker sleeps a fixed 20 ms. Sends
``--requests`` requests, ``--concurrency`` at a time, with httpx, and prints how many were lost (no response) or
failed (not a 200 with the right answer), and p50/p99 of each request's latency minus its workers' own time (the
steps' ``latency_s``). The same overhead for direct ``program(...)`` calls, one at a time, tells the library's part
from the server's.

    .venv/bin/python benchmarks/server_load.py [--requests 200] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import httpx
import uvicorn

from conductor.deploy import create_app
from conductor.modules import Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm

WORKER_DELAY_S = 0.020
WORKFLOW = 'model_id = [0, 1]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'


def scripted_program() -> Conductor:
    pool = WorkerPool(
        [
            ScriptedWorker("planner", lambda _: "1. add", delay_s=WORKER_DELAY_S),
            ScriptedWorker("solver", lambda _: "Answer: 42", delay_s=WORKER_DELAY_S),
        ]
    )
    return Conductor(pool, scripted_lm(lambda _: WORKFLOW))


def percentiles_ms(values: list[float]) -> str:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {cuts[49] * 1000:6.2f} ms   p99 {cuts[98] * 1000:6.2f} ms"


def direct_overheads(program: Conductor, n: int) -> list[float]:
    overheads = []
    for _ in range(n):
        started = time.perf_counter()
        prediction = program(question="What is 40 + 2?")
        overheads.append(time.perf_counter() - started - sum(step.latency_s for step in prediction.trace))
    return overheads


async def load(url: str, requests: int, concurrency: int, timeout_s: float) -> tuple[list[float], int, int]:
    """``(overheads of good answers, lost, failed)``."""
    gate = asyncio.Semaphore(concurrency)
    body = {"model": "bench", "messages": [{"role": "user", "content": "What is 40 + 2?"}]}
    overheads: list[float] = []
    lost = failed = 0

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal lost, failed
        async with gate:
            started = time.perf_counter()
            try:
                response = await client.post(url, json=body)
            except httpx.HTTPError:
                lost += 1
                return
            elapsed = time.perf_counter() - started
        if response.status_code != 200 or response.json()["choices"][0]["message"]["content"] != "42":
            failed += 1
            return
        overheads.append(elapsed - sum(step["latency_s"] for step in response.json()["conductor"]["steps"]))

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(one(client) for _ in range(requests)))
    return overheads, lost, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-seconds", type=float, default=120.0, help="give up on the whole load after this")
    args = parser.parse_args()

    program = scripted_program()
    app = create_app(program, model="bench", concurrency=args.concurrency, request_timeout_s=30.0)
    # Port 0: uvicorn binds a free port, as `conductor serve` binds its own (and so sets TCP_NODELAY the same way).
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        direct = direct_overheads(program, 50)
        started = time.perf_counter()
        overheads, lost, failed = asyncio.run(
            asyncio.wait_for(
                load(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests, args.concurrency, 30.0),
                args.max_seconds,
            )
        )
        wall = time.perf_counter() - started
    finally:
        server.should_exit = True
        thread.join(10)

    print(f"{args.requests} requests, {args.concurrency} at a time, workers sleep {WORKER_DELAY_S * 1000:.0f} ms/step")
    print(f"lost: {lost}   failed: {failed}   ok: {len(overheads)}   ({len(overheads) / wall:.0f} requests/s)")
    print(f"overhead over the workers' time, over HTTP:      {percentiles_ms(overheads)}")
    print(f"overhead over the workers' time, direct (1 at a time): {percentiles_ms(direct)}")


if __name__ == "__main__":
    main()
