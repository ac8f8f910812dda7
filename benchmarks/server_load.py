"""How does the HTTP server hold up under LLM traffic: many concurrent requests whose workers take a second each?

A deployment's workers are API models that answer in seconds, so what runs out first is concurrency (threads,
connections), not CPU; a benchmark whose workers answer in milliseconds measures the wrong thing. Three kinds of
process, each with an open-file limit raised for the connections of the largest level:

- a local OpenAI-compatible stub (Starlette under uvicorn, one process) that answers every ``POST
  /v1/chat/completions`` after ``--worker-delay`` seconds (``asyncio.sleep``), with ``usage``, as a provider would;
- the server under test, in ``--processes N`` processes sharing one listening socket (``conductor serve --workers
  N``'s way, ``conductor.deploy.listening_socket``): ``conductor.deploy.create_app`` under uvicorn, with ``conductor
  serve``'s defaults (an audit log in a SQLite file, no keys, ``--server-concurrency`` runs at once per process),
  serving a ``Conductor`` whose conductor LM answers at once with a two-step workflow over two ``LMWorker``s on the
  stub. Then, in the same run with as many processes, a bare Starlette app whose handler makes the same two calls to
  the stub with one shared aiohttp session: the least a server doing this work can spend;
- this one, the load generator (aiohttp): for each level of ``--concurrency`` it opens that many connections, then
  sends ``--requests`` requests (default: twice the level) that many at a time.

Per level it reports throughput next to the ideal (level / (2 x delay): each request waits for two calls in turn),
lost (no response) and failed (not a 200 with the stub's answer from two steps) requests, p50/p99 of each request's
latency minus its workers' own time (the steps' ``latency_s`` in the response's ``conductor`` field; the bare app
reports its two calls the same way), and the server processes' CPU time (user + system, psutil) over the level per
request; then the conductor server's CPU per request over the bare app's. The load average is printed: on a shared
machine it moves every figure.

Why aiohttp for the generator and not httpx: on a 2-core machine an httpx ``AsyncClient`` alone managed 77, 62 and 51
requests/s against a trivial ``GET /health`` at 16, 32 and 64 connections, where aiohttp managed 613, 609 and 403;
with httpx, the client was what a benchmark measured. The bare app uses aiohttp for the same reason: the cheaper
client makes the CPU ratio the stricter one.

    .venv/bin/python benchmarks/server_load.py [--concurrency 64 256 1024] [--requests N] [--worker-delay 1.0]
        [--processes 1 2] [--server-concurrency 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import multiprocessing
import os
import queue
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import dspy
import psutil
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from conductor.deploy import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S, create_app, listening_socket, tune_gc_for_serving
from conductor.modules import Conductor, LMWorker, Price, WorkerPool
from conductor.testing import scripted_lm

HOST = "127.0.0.1"
STUB_ANSWER = "42"
SUBTASKS = ("plan it", "solve it")
WORKFLOW = f'model_id = [0, 1]\nsubtasks = {json.dumps(list(SUBTASKS))}\naccess_list = [[], "all"]'
BODY = {"model": "bench", "messages": [{"role": "user", "content": "What is 40 + 2?"}]}
WARM_UP_PER_PROCESS = 8
"""Requests sent once per server start, before any level: each process's first worker call sets up litellm."""


def raise_open_file_limit(most_concurrent: int) -> None:
    """Let this process hold the sockets of ``most_concurrent`` requests: a server holds its client's connection and
    two to the stub for each, the generator and the stub fewer."""
    needed = 4 * most_concurrent + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(
            f"{most_concurrent} concurrent requests need {needed} open files, but this process may open at most "
            f"{hard}: raise the hard limit (`ulimit -Hn {needed}` as root) or lower --concurrency"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def stub_app(delay_s: float) -> Starlette:
    """The OpenAI-compatible stub: every chat request answered with ``STUB_ANSWER`` after ``delay_s``."""

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        await asyncio.sleep(delay_s)
        choice = {"index": 0, "message": {"role": "assistant", "content": STUB_ANSWER}, "finish_reason": "stop"}
        return JSONResponse(
            {
                "id": "stub",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "stub"),
                "choices": [choice],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def conductor_app(api_base: str, concurrency: int, audit_db: str) -> Starlette:
    """The server under test: a Conductor whose conductor LM writes ``WORKFLOW`` at once, over two API workers."""

    def api_worker(name: str, model: str) -> LMWorker:  # built as pool configs build `lm` workers; the stub is free
        lm = dspy.LM(f"openai/{model}", api_base=api_base, api_key="x", cache=False, num_retries=0)
        return LMWorker(name, lm, price=Price())

    # Models DSPy's price table lists, as a deployment's are: for a name it lacks, DSPy scans the whole table twice
    # per call to price the answer (0.4 ms of CPU a lookup, against 0.04 for a listed model).
    workers = [api_worker("stub-a", "gpt-4o-mini"), api_worker("stub-b", "gpt-4.1-mini")]
    program = Conductor(WorkerPool(workers), scripted_lm(lambda _: WORKFLOW))
    return create_app(program, model="bench", concurrency=concurrency, audit_db=audit_db)


def bare_app(api_base: str) -> Starlette:
    """The same two calls to the stub with nothing around them, answered as JSON the generator reads alike."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as app.state.session:
            yield

    async def chat(request: Request) -> JSONResponse:
        answer = (await request.json())["messages"][-1]["content"]
        steps = []
        for subtask in SUBTASKS:
            started = time.perf_counter()
            call = {"model": "stub", "messages": [{"role": "user", "content": f"{subtask}\n\n{answer}"}]}
            async with request.app.state.session.post(f"{api_base}/chat/completions", json=call) as response:
                answer = (await response.json())["choices"][0]["message"]["content"]
            steps.append({"latency_s": time.perf_counter() - started})
        message = {"role": "assistant", "content": answer}
        return JSONResponse({"choices": [{"index": 0, "message": message}], "conductor": {"steps": steps}})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)]
    return Starlette(routes=routes, lifespan=lifespan)


def serve(
    make_app: Callable[[], Starlette], sock: socket.socket, ready: multiprocessing.Queue, most_concurrent: int
) -> None:
    """A server process: serve ``make_app()`` on ``sock``, the listening socket all processes of one app share."""
    raise_open_file_limit(most_concurrent)
    logging.getLogger("conductor").setLevel(logging.ERROR)  # the open-server warning, once per process
    config = uvicorn.Config(
        make_app(), log_level="warning", timeout_keep_alive=60, backlog=max(2048, 2 * most_concurrent)
    )
    tune_gc_for_serving()  # as conductor serve does, once the app is built
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            ready.put(True)
        await task

    asyncio.run(run())


@contextlib.contextmanager
def serving(make_app: Callable[[], Starlette], processes: int, most_concurrent: int) -> Iterator[tuple[str, list[int]]]:
    """``make_app``'s app served by ``processes`` processes on one free port: its base URL and the processes' ids."""
    spawn = multiprocessing.get_context("spawn")
    sock = listening_socket(HOST, 0)  # conductor serve's: made so that connections get TCP_NODELAY
    ready = spawn.Queue()
    servers = [
        spawn.Process(target=serve, args=(make_app, sock, ready, most_concurrent), daemon=True)
        for _ in range(processes)
    ]
    for server in servers:
        server.start()
    try:
        wait_listening(servers, ready)
        yield f"http://{HOST}:{sock.getsockname()[1]}", [server.pid for server in servers]
    finally:
        for server in servers:
            server.terminate()
            server.join(10)
        sock.close()


def wait_listening(
    servers: list[multiprocessing.process.BaseProcess], ready: multiprocessing.Queue, most_s: float = 180.0
) -> None:
    """Return once every server process listens; exit, saying so, if one dies first or they take over ``most_s``."""
    deadline, listening = time.monotonic() + most_s, 0
    while listening < len(servers):
        with contextlib.suppress(queue.Empty):
            ready.get(timeout=1)
            listening += 1
        if listening < len(servers) and (time.monotonic() > deadline or not all(s.is_alive() for s in servers)):
            raise SystemExit(f"a server process did not start (its error is printed above) or took over {most_s:g} s")


def workers_time_s(status: int, text: str) -> float | None:
    """The workers' own seconds in a good answer (a 200 with the stub's answer from two steps), else ``None``."""
    if status != 200:
        return None
    try:
        body = json.loads(text)
        steps = body["conductor"]["steps"]
        if body["choices"][0]["message"]["content"] != STUB_ANSWER or len(steps) != len(SUBTASKS):
            return None
        return sum(step["latency_s"] for step in steps)
    except (ValueError, KeyError, IndexError, TypeError):
        return None


@dataclasses.dataclass
class Sent:
    """What ``send`` saw of a batch: the overheads of good answers (seconds), lost and failed requests."""

    overheads: list[float] = dataclasses.field(default_factory=list)
    lost: int = 0
    failed: int = 0


async def send(session: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> Sent:
    """``requests`` chat requests, ``concurrency`` at a time; each one's latency counts from when it is sent."""
    sent, gate = Sent(), asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            started = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/chat/completions", json=BODY) as response:
                    status, text = response.status, await response.text()
            except (TimeoutError, aiohttp.ClientError):
                sent.lost += 1
                return
            latency_s = time.perf_counter() - started
        workers_s = workers_time_s(status, text)
        if workers_s is None:
            sent.failed += 1
        else:
            sent.overheads.append(latency_s - workers_s)

    await asyncio.gather(*(one() for _ in range(requests)))
    return sent


def open_session(concurrency: int) -> aiohttp.ClientSession:
    # Past the server's own timeout, so that a request it gives up on comes back as its 504 (failed), not lost.
    timeout = aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S + 60)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout)


def cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the processes ``pids`` have used, all their threads together."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


@dataclasses.dataclass
class Level:
    """One app at one concurrency level: the figures the table and ``--json`` report."""

    app: str
    processes: int
    concurrency: int
    requests: int
    lost: int
    failed: int
    throughput: float  # good answers per second
    ideal: float  # concurrency / (2 x worker delay)
    ratio: float  # throughput / ideal
    p50_overhead_ms: float | None
    p99_overhead_ms: float | None
    cpu_ms_per_request: float


async def measure(app: str, url: str, pids: list[int], concurrency: int, requests: int, delay_s: float) -> Level:
    """One level: open ``concurrency`` connections (``GET /health``), then time ``requests`` requests over them."""
    async with open_session(concurrency) as session:
        for answer in await asyncio.gather(*(session.get(f"{url}/health") for _ in range(concurrency))):
            answer.release()  # back to the pool, kept alive
        cpu_before, started = cpu_s(pids), time.perf_counter()
        sent = await send(session, url, requests, concurrency)
        wall_s, cpu_used_s = time.perf_counter() - started, cpu_s(pids) - cpu_before
    throughput, ideal = len(sent.overheads) / wall_s, concurrency / (len(SUBTASKS) * delay_s)
    cuts = statistics.quantiles(sent.overheads, n=100, method="inclusive") if len(sent.overheads) > 1 else None
    return Level(
        app=app,
        processes=len(pids),
        concurrency=concurrency,
        requests=requests,
        lost=sent.lost,
        failed=sent.failed,
        throughput=throughput,
        ideal=ideal,
        ratio=throughput / ideal,
        p50_overhead_ms=cuts[49] * 1000 if cuts else None,
        p99_overhead_ms=cuts[98] * 1000 if cuts else None,
        cpu_ms_per_request=cpu_used_s * 1000 / requests,
    )


async def warm_up(url: str, processes: int) -> None:
    """A few requests once per server start, none of them measured (see ``WARM_UP_PER_PROCESS``)."""
    async with open_session(WARM_UP_PER_PROCESS * processes) as session:
        await send(session, url, WARM_UP_PER_PROCESS * processes, WARM_UP_PER_PROCESS * processes)


HEADER = (
    f"{'app':<10}{'procs':>6}{'conc':>6}{'requests':>9}{'req/s':>8}{'ideal':>8}{'ratio':>7}{'lost':>6}{'failed':>7}"
    f"{'p50 ms':>9}{'p99 ms':>9}{'CPU ms/req':>11}"
)


def row(level: Level) -> str:
    def ms(value: float | None) -> str:
        return f"{value:9.1f}" if value is not None else f"{'-':>9}"

    return (
        f"{level.app:<10}{level.processes:>6}{level.concurrency:>6}{level.requests:>9}{level.throughput:8.1f}"
        f"{level.ideal:8.1f}{level.ratio:7.2f}{level.lost:>6}{level.failed:>7}{ms(level.p50_overhead_ms)}"
        f"{ms(level.p99_overhead_ms)}{level.cpu_ms_per_request:11.2f}"
    )


def run_app(app: str, make_app: Callable[[], Starlette], processes: int, args: argparse.Namespace) -> list[Level]:
    """Every level against ``make_app``'s app served by ``processes`` processes, each row printed as it ends."""
    levels = []
    with serving(make_app, processes, max(args.concurrency)) as (url, pids):
        asyncio.run(warm_up(url, processes))
        for concurrency in args.concurrency:
            requests = args.requests or 2 * concurrency
            levels.append(asyncio.run(measure(app, url, pids, concurrency, requests, args.worker_delay)))
            print(row(levels[-1]), flush=True)
    return levels


def positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=positive(int), nargs="+", default=[64, 256, 1024], metavar="N")
    parser.add_argument("--requests", type=positive(int), help="per level (default: twice its concurrency)")
    parser.add_argument("--worker-delay", type=positive(float), default=1.0, metavar="S", help="the stub's answer time")
    parser.add_argument(
        "--processes", type=positive(int), nargs="+", default=[1, 2], metavar="N", help="conductor serve --workers N"
    )
    parser.add_argument(
        "--server-concurrency",
        type=positive(int),
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="create_app's concurrency: runs at once per process (conductor serve --concurrency)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    return parser.parse_args()


def cpu_ratios(levels: list[Level]) -> dict[tuple[int, int], float | None]:
    """The conductor server's CPU per request over the bare app's, by (processes, concurrency); ``None`` where the
    bare app's stayed under the clock tick CPU time is counted in."""
    bare = {
        (level.processes, level.concurrency): level.cpu_ms_per_request for level in levels if level.app == "starlette"
    }
    ratios = {}
    for level in levels:
        key = (level.processes, level.concurrency)
        if level.app == "conductor" and key in bare:
            ratios[key] = level.cpu_ms_per_request / bare[key] if bare[key] else None
    return ratios


def main() -> None:
    args = parse_args()
    most_concurrent = max(args.concurrency)
    raise_open_file_limit(most_concurrent)
    load_before = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}   cores: {os.cpu_count()}")
    print(
        f"workers: {len(SUBTASKS)} steps of {args.worker_delay:g} s (stub); conductor server: "
        f"{args.server_concurrency} runs at once per process, audit log in SQLite, no keys"
    )
    print(HEADER)
    levels: list[Level] = []
    with (
        serving(functools.partial(stub_app, args.worker_delay), 1, most_concurrent) as (stub_url, _),
        tempfile.TemporaryDirectory() as folder,
    ):
        api_base = f"{stub_url}/v1"
        apps = {
            "conductor": functools.partial(conductor_app, api_base, args.server_concurrency, f"{folder}/audit.sqlite"),
            "starlette": functools.partial(bare_app, api_base),
        }
        for processes in args.processes:
            for app, make_app in apps.items():
                levels += run_app(app, make_app, processes, args)
    load_after = os.getloadavg()
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in load_after)}")
    ratios = cpu_ratios(levels)
    for (processes, concurrency), ratio in ratios.items():
        figure = f"{ratio:.1f}x" if ratio is not None else "too few requests to tell (the bare app's CPU: 0 ticks)"
        print(f"CPU per request, conductor / bare app, {processes} process(es) at {concurrency} concurrent: {figure}")
    if args.json:
        figures = {
            "command": " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
            "cores": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "worker_delay_s": args.worker_delay,
            "server_concurrency": args.server_concurrency,
            "levels": [dataclasses.asdict(level) for level in levels],
            "cpu_ratios": [{"processes": p, "concurrency": c, "ratio": r} for (p, c), r in ratios.items()],
        }
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=2)


if __name__ == "__main__":
    main()
