"""How many requests a second does the HTTP server answer, and how much time does it add over the workers' own?

The server runs in its own processes (``conductor.deploy.create_app`` under uvicorn on 127.0.0.1, a free port;
``--processes N`` share one listening socket, as ``conductor serve --workers N`` does): a scripted program whose
conductor LM answers at once with a two-step workflow, and whose two workers each sleep a fixed 20 ms. This process
only generates load: for each concurrency level (16, 32, 64 by default) it sends ``--requests`` requests that many
at a time with aiohttp, and prints how many were lost (no response) or failed (not a 200 with the right answer), the
throughput, and p50/p99 of each request's latency minus its workers' own time (the steps' ``latency_s``). The same
overhead for direct ``program(...)`` calls, one at a time and before any load, tells the library's part from the
server's. The load average is printed: on a shared machine it moves every figure.

Why aiohttp (installed with litellm) and not httpx: on this machine an httpx ``AsyncClient`` alone managed 77, 62 and
51 requests/s against the server's trivial ``GET /health`` at 16, 32 and 64 connections, where aiohttp managed 613,
609 and 403; with httpx, the client was what this benchmark measured.

    .venv/bin/python benchmarks/server_load.py [--requests 400] [--concurrency 16 32 64] [--threads 64] [--processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import time

import aiohttp

from conductor.deploy import listening_socket

WORKER_DELAY_S = 0.020
WORKFLOW = 'model_id = [0, 1]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'
BODY = {"model": "bench", "messages": [{"role": "user", "content": "What is 40 + 2?"}]}


def scripted_program():
    from conductor.modules import Conductor, WorkerPool
    from conductor.testing import ScriptedWorker, scripted_lm

    pool = WorkerPool(
        [
            ScriptedWorker("planner", lambda _: "1. add", delay_s=WORKER_DELAY_S),
            ScriptedWorker("solver", lambda _: "Answer: 42", delay_s=WORKER_DELAY_S),
        ]
    )
    return Conductor(pool, scripted_lm(lambda _: WORKFLOW))


def serve(threads: int, sock, ready: multiprocessing.Queue) -> None:
    """A server process: serve the scripted program on ``sock``, the listening socket every server process shares."""
    import logging

    import uvicorn

    from conductor.deploy import create_app

    logging.getLogger("conductor").setLevel(logging.ERROR)  # the open-server warning, once per process
    app = create_app(scripted_program(), model="bench", concurrency=threads, request_timeout_s=60.0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=60))

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        ready.put(True)
        await task

    asyncio.run(run())


def percentiles_ms(values: list[float]) -> str:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {cuts[49] * 1000:7.2f} ms   p99 {cuts[98] * 1000:7.2f} ms"


def direct_overheads(n: int) -> list[float]:
    program = scripted_program()
    overheads = []
    for _ in range(n):
        started = time.perf_counter()
        prediction = program(question="What is 40 + 2?")
        overheads.append(time.perf_counter() - started - sum(step.latency_s for step in prediction.trace))
    return overheads


async def load(url: str, requests: int, concurrency: int) -> tuple[list[float], int, int, float]:
    """``(overheads of good answers, lost, failed, wall seconds)``."""
    gate = asyncio.Semaphore(concurrency)
    overheads: list[float] = []
    lost = failed = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal lost, failed
        async with gate:
            started = time.perf_counter()
            try:
                async with session.post(url, json=BODY) as response:
                    body = await response.json()
            except aiohttp.ClientError:
                lost += 1
                return
            elapsed = time.perf_counter() - started
        if response.status != 200 or body["choices"][0]["message"]["content"] != "42":
            failed += 1
            return
        overheads.append(elapsed - sum(step["latency_s"] for step in body["conductor"]["steps"]))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(one(session) for _ in range(concurrency)))  # warm up: open the connections
        overheads.clear()
        started = time.perf_counter()
        await asyncio.gather(*(one(session) for _ in range(requests)))
        return overheads, lost, failed, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--threads", type=int, default=64, help="run threads per server process (create_app's)")
    parser.add_argument("--processes", type=int, default=1, help="server processes (conductor serve --workers)")
    args = parser.parse_args()

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}   cores: {os.cpu_count()}")
    direct = direct_overheads(50)
    spawn = multiprocessing.get_context("spawn")
    sock = listening_socket("127.0.0.1", 0)  # conductor serve's: made so that connections get TCP_NODELAY
    port, ready = sock.getsockname()[1], spawn.Queue()
    servers = [
        spawn.Process(target=serve, args=(args.threads, sock, ready), daemon=True) for _ in range(args.processes)
    ]
    for server in servers:
        server.start()
    try:
        for _ in servers:
            ready.get(timeout=120)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        print(
            f"workers sleep {WORKER_DELAY_S * 1000:.0f} ms/step, 2 steps; "
            f"server: {args.processes} process(es) of {args.threads} run threads"
        )
        print(f"direct program(...) calls, 1 at a time, overhead:   {percentiles_ms(direct)}")
        for concurrency in args.concurrency:
            overheads, lost, failed, wall = asyncio.run(load(url, args.requests, concurrency))
            rate = len(overheads) / wall
            print(
                f"{concurrency:3d} concurrent: {rate:6.0f} requests/s   overhead {percentiles_ms(overheads)}   "
                f"(ok {len(overheads)}, lost {lost}, failed {failed})"
            )
    finally:
        for server in servers:
            server.terminate()
            server.join(10)
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
