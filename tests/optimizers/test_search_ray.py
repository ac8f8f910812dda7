"""Program search on a local Ray cluster: its questions, scored one per actor, get the very outcomes they get in this
process, the actors keep their samples in the search's store, and the worker-call budget holds with questions in
flight."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.bench.simulated import simulated_dataset, simulated_metric
from conductor.modules import Conductor, ReplayStore, WorkerPool
from conductor.optimizers import ProgramSearchConfig, program_search
from tests.bench.test_runner import _config
from tests.deploy.helpers import fixed_lm

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("local_cluster")]  # one cluster at a time


@pytest.mark.slow  # its actors load the deploy stack: about 30 s here
def test_a_search_on_ray_scores_as_in_this_process_within_its_budget(tmp_path: Path) -> None:
    _config(tmp_path)  # writes pool.yaml: the oracle, and the flaky tool that fails one task
    program = Conductor(WorkerPool.from_file(tmp_path / "pool.yaml"), fixed_lm(), max_steps=2)
    examples = simulated_dataset(["math500", "mmlu"], 4, seed=0)
    config = ProgramSearchConfig(first_rung=3, eta=2)  # two rungs: survivors are picked from outcomes on Ray too
    here = program_search(program, examples, simulated_metric, config, output_dir=tmp_path / "here")
    on_ray = program_search(program, examples, simulated_metric, config, output_dir=tmp_path / "ray", ray="auto")
    assert on_ray.outcomes == here.outcomes and on_ray.rungs == here.rungs
    assert {o.score for row in here.outcomes for o in row.values()} == {0.0, 1.0}  # something to tell apart
    assert on_ray.cost.worker_calls == here.cost.worker_calls > 0
    kept = len(ReplayStore(tmp_path / "ray" / "replay.sqlite"))  # the actors' samples, in the search's folder
    assert 0 < kept <= on_ray.cost.worker_calls  # (a failed call is paid for, not kept)

    capped = config.model_copy(update={"max_worker_calls": here.cost.worker_calls // 2})
    cut = program_search(program, examples, simulated_metric, capped, output_dir=tmp_path / "capped", ray="auto")
    assert cut.exhausted and 0 < cut.cost.worker_calls <= capped.max_worker_calls
