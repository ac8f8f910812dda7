"""Scoring on a local Ray cluster: a bench config's units, sharded over one actor per CPU, give the very records they
give in this process, and so does a saved program scored by ``evaluate_program`` (``conductor eval`` and
``compile``); without Ray installed, asking for it is a clear error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from conductor.bench import run_benchmark, validate_config
from conductor.errors import MissingDependency
from tests.bench.test_runner import _comparable, _config

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time on the machine (pyproject's addopts)


def test_a_config_gives_the_same_records_on_ray_as_in_this_process(tmp_path: Path, local_cluster: None) -> None:
    data = _config(tmp_path, n=3, threads=2, pool={"simulated": {"models": ["gemma-3-27b", "qwen3-32b-direct"]}})
    data["methods"] += [
        {"name": "random", "type": "random", "args": {"max_steps": 3}},
        {"name": "moa", "type": "moa", "args": {"aggregator": 1}},
    ]
    here = run_benchmark(validate_config({**data, "output": "here"}, base_dir=tmp_path), progress=False)
    on_ray = run_benchmark(validate_config({**data, "output": "ray", "ray": "auto"}, base_dir=tmp_path), progress=False)
    assert len(here) == 2 * 2 * 3 * 4  # seeds x datasets x examples x methods
    assert _comparable(on_ray) == _comparable(here)
    assert {r["correct"] for r in here} == {0.0, 1.0}  # a comparison of something: some right, some wrong
    resumed = run_benchmark(validate_config({**data, "output": "ray", "ray": "auto"}, base_dir=tmp_path))
    assert resumed == on_ray  # everything was recorded: nothing runs again


def test_a_method_the_pool_cant_run_is_named_by_the_actors(tmp_path: Path, local_cluster: None) -> None:
    from conductor.errors import ConfigError

    data = _config(tmp_path, n=1, ray="auto")
    data["methods"].append({"name": "sc", "type": "self_consistency", "args": {"worker": 9}})
    with pytest.raises(ConfigError, match="method 'sc': SelfConsistency: step 0: unknown worker 9"):
        run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)


def test_ray_asked_for_without_ray_installed_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    config = validate_config(_config(tmp_path, n=1, ray="auto"), base_dir=tmp_path)
    with pytest.raises(MissingDependency, match=r"pip install 'dspy-conductor\[ray\]'"):
        run_benchmark(config, progress=False)


@pytest.mark.slow  # its tasks load the deploy stack: about 30 s here
def test_a_program_scores_the_same_on_ray_as_in_this_process(tmp_path: Path, local_cluster: None) -> None:
    from conductor.bench.simulated import simulated_dataset, simulated_metric
    from conductor.modules import Conductor, ReplayStore, WorkerPool
    from conductor.optimizers import evaluate_program
    from tests.deploy.helpers import fixed_lm

    _config(tmp_path)  # writes pool.yaml: the oracle and the flaky tool
    pool = WorkerPool.from_file(tmp_path / "pool.yaml")
    workflow = 'model_id = [1]\nsubtasks = ["Solve it."]\naccess_list = [[]]'  # the flaky tool: wrong on one task
    program = Conductor(pool, fixed_lm(workflow), max_steps=1)
    examples = simulated_dataset(["math500"], 4, seed=0)
    here = evaluate_program(program, examples, simulated_metric, threads=2)
    on_ray = evaluate_program(program, examples, simulated_metric, threads=2, ray="auto")
    assert on_ray.score == here.score == 75.0
    assert [(e, p.answer, s) for e, p, s in on_ray.results] == [(e, p.answer, s) for e, p, s in here.results]

    # A saved program names no replay store: the tasks rebuild the program's replay workers on the asking pool's.
    spec = yaml.safe_load((tmp_path / "pool.yaml").read_text())
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"workers": [w | {"replay": True} for w in spec["workers"]]}))
    store = ReplayStore(tmp_path / "replay.sqlite")
    stored = Conductor(
        WorkerPool.from_file(tmp_path / "pool.yaml", replay_store=store), fixed_lm(workflow), max_steps=1
    )
    assert evaluate_program(stored, examples, simulated_metric, threads=2, ray="auto").score == 75.0
    assert len(store) == 3  # the flaky tool's three answers; its failure is not kept
