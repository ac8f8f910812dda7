"""Running a config: every (method, dataset, seed, example) is a unit, run on a thread pool (or, with ``ray``, in one
actor per CPU of a Ray cluster) and recorded as one line of ``results.jsonl`` as soon as it finishes, so a killed run
resumes where it stopped.

A unit never crashes the run: whatever its program or metric raises is recorded as that unit's failure
(``correct = 0``, ``error_kind = "exception"``), next to the run errors the executor reports itself (a worker that
failed for good is ``execution``, an unusable workflow ``format``, ...).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dspy
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from conductor._ray import ONE_THREAD, connect, cpus
from conductor.bench._config import BenchConfig
from conductor.bench.datasets import example_id
from conductor.bench.datasets._dispatch import Metric
from conductor.errors import ConductorError, ConfigError
from conductor.modules import PoolProgram, WorkerPool

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
MAX_ANSWER_CHARS = 500  # answers are kept for inspection, not in full: a record stays one short line


@dataclass(frozen=True)
class Unit:
    """One method answering one example of one dataset under one seed: the grain of the results and of resuming."""

    method: str
    dataset: str
    seed: int
    example_id: str

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.method, self.dataset, self.seed, self.example_id)


def record_key(record: dict[str, Any]) -> tuple[str, str, int, str]:
    """The ``Unit.key`` a record was made for."""
    return (record["method"], record["dataset"], record["seed"], record["example_id"])


class ResultsFile:
    """The append-only JSONL of a run, one record per finished unit. Each line is flushed and fsynced before the next
    unit is recorded, so a killed process loses at most the units in flight; a line torn by a kill mid-write is
    skipped when reading and ended before the next append. Not thread-safe: the run appends from one thread."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> list[dict[str, Any]]:
        """Every whole record, in the order written."""
        if not self.path.is_file():
            return []
        records = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s:%d is not a whole record (a run killed mid-write?); skipped", self.path, number)
        return records

    def latest(self) -> list[dict[str, Any]]:
        """The last record of each unit, in the order first written: a unit rerun (its method, pool or checkpoint
        changed since it was recorded) counts once, as it was last run."""
        return list({record_key(r): r for r in self.read()}.values())

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=str) + "\n"
        with open(self.path, "a+b") as file:
            if file.tell() > 0:
                file.seek(-1, os.SEEK_END)
                if file.read(1) != b"\n":
                    line = "\n" + line  # end the torn line so this record starts on its own
            file.write(line.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def unique_ids(examples: Sequence[dspy.Example]) -> list[str]:
    """Stable ids of ``examples`` (``example_id``, a hash of the question); a repeated question gets ``#2``, ..."""
    seen: dict[str, int] = {}
    ids = []
    for example in examples:
        base = example_id(example)
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return ids


def workflow_shape(pool: WorkerPool, prediction: dspy.Prediction) -> dict[str, Any] | None:
    """The shape of the workflow that gave ``prediction``'s answer, for the workflow-shape tables: its steps' workers
    by name (a step on the conductor itself is "conductor"), what each step saw ("all" or the indices of earlier
    steps), and the conductor's rounds (1 without recursion); ``None`` when no workflow ran."""
    workflow = prediction.get("workflow")
    if workflow is None:
        return None
    shape = workflow.shape(pool.names)
    return {
        "workers": [worker for worker, _ in shape],
        "access": [access if access == "all" else list(access) for _, access in shape],
        "rounds": len(prediction.get("rounds") or ()) or 1,
    }


def run_unit(unit: Unit, program: PoolProgram, example: dspy.Example, metric: Metric) -> dict[str, Any]:
    """Run one unit and return its record; whatever the program or the metric raises becomes the record's error."""
    record: dict[str, Any] = {
        **asdict(unit),
        "expected": example.answer,
        "answer": None,
        "correct": 0.0,
        "tokens": 0,
        "cost": 0.0,
        "calls": 0,
        "latency_s": 0.0,
        "error_kind": None,
        "error": None,
        "workflow": None,
    }
    started = time.perf_counter()
    try:
        prediction = program(**example.inputs())
        answer = prediction.answer
        record.update(
            answer=None if answer is None else str(answer)[:MAX_ANSWER_CHARS],
            tokens=prediction.tokens,
            cost=prediction.cost,
            calls=len(prediction.trace),
            workflow=workflow_shape(program.pool, prediction),
        )
        if prediction.error is not None:
            record.update(error_kind=prediction.error.kind, error=prediction.error.message)
        record["correct"] = float(metric(example, prediction))
    except Exception as exc:
        logger.warning("%s on %s (seed %d, %s) raised %r", unit.method, unit.dataset, unit.seed, unit.example_id, exc)
        record.update(correct=0.0, error_kind="exception", error=f"{type(exc).__name__}: {exc}")
    record["latency_s"] = round(time.perf_counter() - started, 4)
    return record


@dataclass(frozen=True)
class _Job:
    unit: Unit
    example: dspy.Example
    fingerprint: str


def _load_datasets(config: BenchConfig) -> dict[str, list[dspy.Example]]:
    """Every dataset's examples by label; every dataset that fails to load is named in one ``ConfigError``."""
    loaded, problems = {}, []
    for spec in config.datasets:
        try:
            loaded[spec.label] = spec.load()
        except ConductorError as exc:
            problems.append(f"  dataset {spec.label!r}: {exc}")
    if problems:
        raise ConfigError("can't load the datasets:\n" + "\n".join(problems))
    return loaded


def _build_programs(config: BenchConfig) -> tuple[dict[tuple[str, int], PoolProgram], list[WorkerPool]]:
    """Every method's program per seed, and the pools (one per seed); every method the pool can't run is named in
    one ``ConfigError``."""
    programs, problems, pools = {}, {}, []
    for seed in config.seeds:
        pool = config.build_pool(seed)
        pools.append(pool)
        for method in config.methods:
            if method.name in problems or method.gone:  # a gone program's units are all recorded (run_benchmark)
                continue
            try:
                programs[method.name, seed] = method.build(pool, seed)
            except ConductorError as exc:
                problems[method.name] = f"  method {method.name!r}: {exc}"
    if problems:
        for pool in pools:
            pool.close()
        raise ConfigError("can't build the methods over the pool:\n" + "\n".join(problems.values()))
    return programs, pools


def _jobs(config: BenchConfig) -> list[_Job]:
    """Every unit of the config, example by example so that a partial run covers every method alike."""
    examples = _load_datasets(config)
    jobs = []
    for seed in config.seeds:
        for dataset in config.datasets:
            data = examples[dataset.label]
            fingerprints = {m.name: config.fingerprint(m, dataset) for m in config.methods}
            for eid, example in zip(unique_ids(data), data, strict=True):
                for method in config.methods:
                    jobs.append(_Job(Unit(method.name, dataset.label, seed, eid), example, fingerprints[method.name]))
    return jobs


class UnitRunner:
    """Runs units of ``config``: every method's program built once per seed, each unit scored by its dataset's
    metric. In this process for a thread pool, or in each Ray actor (built there from the config, so models load in
    the process that runs them)."""

    def __init__(self, config: BenchConfig):
        self.programs, self.pools = _build_programs(config)
        self.metrics = {dataset.label: dataset.metric for dataset in config.datasets}

    def run(self, unit: Unit, example: dspy.Example) -> dict[str, Any]:
        return run_unit(unit, self.programs[unit.method, unit.seed], example, self.metrics[unit.dataset])

    def close(self) -> None:
        for pool in self.pools:
            pool.close()


def _run_on_threads(config: BenchConfig, pending: list[_Job]) -> Iterator[dict[str, Any]]:
    """The records of ``pending``, as they finish, ``config.threads`` at once in this process."""
    runner = UnitRunner(config)
    executor = ThreadPoolExecutor(config.threads, thread_name_prefix="bench")
    try:
        futures = [
            executor.submit(contextvars.copy_context().run, runner.run, job.unit, job.example) for job in pending
        ]
        for future in as_completed(futures):
            yield future.result()
    finally:
        executor.shutdown(wait=False, cancel_futures=True)  # on an interrupt: stop at once, lose only units in flight
        runner.close()


class _RayUnitRunner(UnitRunner):
    """A ``UnitRunner`` as a Ray actor: a config the pool can't run is reported by ``problem``, not by a dead actor."""

    def __init__(self, config: BenchConfig):
        self.problem: str | None = None
        try:
            super().__init__(config)
        except ConductorError as exc:
            self.problem = str(exc)

    def check(self) -> str | None:
        return self.problem


def _run_on_ray(config: BenchConfig, pending: list[_Job]) -> Iterator[dict[str, Any]]:
    """The records of ``pending``, as they finish, in one actor per CPU of the Ray cluster at ``config.ray`` (each
    running ``config.threads`` units at once); a unit goes to the next actor with a free thread."""
    ray = connect(config.ray)
    from ray.util import ActorPool

    remote = ray.remote(_RayUnitRunner).options(**ONE_THREAD, max_concurrency=config.threads)
    actors = [remote.remote(config) for _ in range(min(cpus(ray), len(pending)))]
    try:
        problem = next(filter(None, ray.get([actor.check.remote() for actor in actors])), None)
        if problem is not None:
            raise ConfigError(problem)
        slots = ActorPool([actor for actor in actors for _ in range(config.threads)])
        yield from slots.map_unordered(lambda actor, job: actor.run.remote(job.unit, job.example), pending)
    finally:
        for actor in actors:
            ray.kill(actor)


@contextmanager
def _progress(total: int, done: int, enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr; yields ``advance(record)``."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), disable=not enabled) as bar:
        task = bar.add_task("units", total=total, completed=done)
        failed = 0

        def advance(record: dict[str, Any]) -> None:
            nonlocal failed
            failed += record["error_kind"] is not None
            bar.update(task, advance=1, description=f"units ({failed} with errors)")

        yield advance


def _check_gone(gone: dict[str, Path], jobs: list[_Job], pending: list[_Job], results: Path) -> None:
    """Refuse a run that would need a program that isn't there; warn where its recorded units stand in for it."""
    missing = Counter(job.unit.method for job in pending if job.unit.method in gone)
    if missing:
        total = Counter(job.unit.method for job in jobs)
        raise ConfigError(
            "can't run methods whose saved program is not there:\n"
            + "\n".join(
                f"  method {name!r}: {gone[name]} is not a saved program folder, and {count} of its {total[name]} "
                f"units are not recorded in {results}"
                for name, count in missing.items()
            )
        )
    for name, folder in gone.items():
        logger.warning("method %r: %s is not there; its recorded units are kept as they were recorded", name, folder)


def run_benchmark(config: BenchConfig, *, fresh: bool = False, progress: bool = True) -> list[dict[str, Any]]:
    """Run every unit of ``config`` that ``output/results.jsonl`` doesn't already hold (all of them with ``fresh``)
    and return the records of every unit, in the config's order.

    A record counts as done only if it was made with the same pool, method and dataset settings (its
    ``fingerprint``); others are recomputed. A method whose saved program folder is gone keeps the records it has,
    unchecked (nothing is left to check them against), so that a row can join a bench whose other checkpoints were
    not kept; ``ConfigError`` if any of its units is unrecorded. Models load once per process; ``config.threads``
    units run at once (per actor with ``config.ray``: a unit's record is the same wherever it runs).
    """
    store = ResultsFile(config.output / RESULTS_FILE)
    jobs = _jobs(config)
    current = {job.unit.key: job.fingerprint for job in jobs}
    gone = {method.name: method.gone for method in config.methods if method.gone}
    results = {
        record_key(r): r
        for r in ([] if fresh else store.read())
        if record_key(r) in current and (r["method"] in gone or current[record_key(r)] == r.get("fingerprint"))
    }
    pending = [job for job in jobs if job.unit.key not in results]
    _check_gone(gone, jobs, pending, store.path)  # before --fresh clears anything
    if fresh:
        store.clear()
    logger.info("%d units: %d already recorded, %d to run", len(jobs), len(jobs) - len(pending), len(pending))
    started = time.perf_counter()
    run = _run_on_ray if config.ray is not None and pending else _run_on_threads
    with _progress(len(jobs), len(jobs) - len(pending), progress) as advance:
        for finished in run(config, pending):
            record = {**finished, "fingerprint": current[record_key(finished)]}
            store.append(record)
            results[record_key(record)] = record
            advance(record)
    logger.info("ran %d units in %.1f s", len(pending), time.perf_counter() - started)
    return [results[job.unit.key] for job in jobs]
