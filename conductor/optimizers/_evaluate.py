"""Scoring a program on examples: ``dspy.Evaluate`` in this process, or its examples sharded over Ray tasks.

On Ray the program travels as its saved folder (``conductor.save``), never as live models or thread pools: each task
loads it in its own process (one torch thread), scores its consecutive share of the examples and returns the
``(example, prediction, score)`` triples, which join in the examples' order. A program scores each example on its
own, so the results are the same wherever they run. A saved program names no replay store, so when the program's
replay workers keep their completions in one, the tasks are told it and rebuild their pools on it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.evaluate import EvaluationResult

from conductor._ray import ONE_THREAD, connect, consecutive_shards, cpus, pack_folder, unpack_folder
from conductor.deploy import load_program, save_program
from conductor.modules import Conductor, ReplayStore

Triple = tuple[dspy.Example, dspy.Prediction, float]


def evaluate_program(
    program: Conductor,
    examples: Sequence[dspy.Example],
    metric: Callable[..., Any],
    *,
    threads: int = 1,
    ray: str | None = None,
) -> EvaluationResult:
    """``dspy.Evaluate``'s result (``score`` in percent; an example that raised scores 0), ``threads`` examples at
    once; with ``ray`` (a cluster address), in one task per CPU of that cluster, ``threads`` at once in each."""
    if ray is None:
        return dspy.Evaluate(devset=list(examples), metric=metric, num_threads=threads, failure_score=0.0)(program)
    cluster = connect(ray)
    with tempfile.TemporaryDirectory(prefix="conductor-eval-") as folder:
        files = cluster.put(pack_folder(save_program(program, Path(folder) / "program")))
    task = cluster.remote(_score_shard).options(**ONE_THREAD)
    store = program.pool.replay_store
    shards = [
        task.remote(files, shard, metric, threads, store) for shard in consecutive_shards(examples, cpus(cluster))
    ]
    results = [triple for shard in cluster.get(shards) for triple in shard]
    total = sum(score for *_, score in results)
    return EvaluationResult(score=round(100 * total / len(results), 2) if results else 0.0, results=results)


def _score_shard(
    files: dict[str, bytes],
    examples: list[dspy.Example],
    metric: Callable[..., Any],
    threads: int,
    store: ReplayStore | None,
) -> list[Triple]:
    """One Ray task: load the shipped program (saved by the process that asked: its code is that process's own),
    its replay workers on ``store`` when given, and score ``examples`` with it."""
    folder = unpack_folder(files)
    program = load_program(folder, trust_code=True)
    if store is not None:
        program = program.replaying_on(store)
    try:
        return evaluate_program(program, examples, metric, threads=threads).results
    finally:
        program.pool.close()
        shutil.rmtree(folder, ignore_errors=True)
