"""The experiment runner on tool pools that answer SIMULATED tasks (no model is called): config validation, resuming
after a kill, failures recorded per unit, the Wilson interval and the report's shape."""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from operator import itemgetter
from pathlib import Path

import pytest
import yaml

from conductor.bench import (
    ALL,
    METHODS,
    RESULTS_FILE,
    ResultsFile,
    load_config,
    run_benchmark,
    shape_text,
    summarise,
    validate_config,
    wilson_interval,
    workflow_shapes,
    write_report,
)
from conductor.bench import _config as runner_config
from conductor.bench._config import MethodType
from conductor.bench.simulated import simulated_dataset, simulated_task
from conductor.cli import main as conductor_main
from conductor.errors import ConfigError
from conductor.modules import WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm

ROOT = Path(__file__).resolve().parents[2]
FAILING_TASK = "math500:0:3"  # the flaky tool fails on this task only
CALLS: Counter[str] = Counter()  # tool calls by tool name
_lock = threading.Lock()


def _task_id(text: str) -> str:
    return text.split("[sim-task ", 1)[1].split("]", 1)[0]


def oracle(text: str) -> str:
    """A tool that answers every SIMULATED task right."""
    with _lock:
        CALLS["oracle"] += 1
    return f"Answer: {simulated_task(_task_id(text)).answer}"


def flaky(text: str) -> str:
    """A tool that answers right, except that it fails on ``FAILING_TASK``."""
    with _lock:
        CALLS["flaky"] += 1
    if _task_id(text) == FAILING_TASK:
        raise RuntimeError("the flaky tool is down")
    return f"Answer: {simulated_task(_task_id(text)).answer}"


def slow_oracle(text: str) -> str:
    time.sleep(0.05)
    return oracle(text)


def _calls() -> Counter[str]:
    """The counter of this module as the pool imported it (pytest may have imported this file under another name)."""
    return importlib.import_module("tests.bench.test_runner").CALLS


def _config(tmp_path: Path, *, tool: str = "oracle", n: int = 4, **overrides) -> dict:
    pool = {
        "workers": [
            {"name": "oracle", "kind": "tool", "tool": f"tests.bench.test_runner:{tool}", "retries": 0},
            {"name": "flaky", "kind": "tool", "tool": "tests.bench.test_runner:flaky", "retries": 0},
        ]
    }
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    return {
        "title": "test",
        "pool": "pool.yaml",
        "datasets": [
            {"name": "simulated", "args": {"family": "math500"}, "n": n},
            {"name": "simulated", "args": {"family": "mmlu"}, "n": n},
        ],
        "methods": [
            {"name": "oracle", "type": "single", "args": {"worker": 0}},
            {"name": "flaky", "type": "single", "args": {"worker": 1}},
        ],
        "seeds": [0, 1],
        "threads": 2,
        "output": "out",
        **overrides,
    }


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "latency_s"} for r in records]


@pytest.fixture(autouse=True)
def reset_calls():
    _calls().clear()


# ---- config --------------------------------------------------------------------------------------------------------
def test_every_config_problem_is_reported_at_once(tmp_path):
    data = _config(tmp_path)
    data["pool"] = "missing.yaml"
    data["threads"] = 0
    data["datasets"][0]["name"] = "nope"
    data["datasets"][1]["args"] = {"family": "mmlu", "extra": 1}
    data["methods"] = [
        {"name": "a", "type": "self_consistency", "args": {"k": 0, "wrker": 1}},
        {"name": "a", "type": "plan_solve_verify", "args": {"planner": 0}},
        {"name": "b", "type": "telepathy"},
        {"name": "c", "type": "conductor", "args": {}},
    ]
    with pytest.raises(ConfigError) as caught:
        validate_config(data, base_dir=tmp_path)
    message = str(caught.value)
    for expected in (
        "pool: the pool file",
        "threads: Input should be greater than or equal to 1",
        "datasets.0.name: Input should be 'mmlu'",
        "args.extra: Extra inputs are not permitted",
        "args.k: Input should be greater than or equal to 1",
        "args.wrker: Extra inputs are not permitted",
        "args.solver: Field required",
        "args.verifier: Field required",
        "methods.2.type: Input should be 'conductor'",
        "args.lm: Field required",
    ):
        assert expected in message
    assert "(8 problems)" in message  # one line per field; a method's or dataset's args share one line


def test_duplicate_names_and_seeds_are_refused(tmp_path):
    data = _config(tmp_path, seeds=[1, 1])
    data["methods"][1]["name"] = "oracle"
    data["datasets"][1] = data["datasets"][0]
    with pytest.raises(ConfigError, match="method names must be unique; repeated: \\['oracle'\\]"):
        validate_config(data, base_dir=tmp_path)


def test_paths_are_relative_to_the_config_file_and_overrides_apply(tmp_path):
    config = load_config(_write(tmp_path, _config(tmp_path)), n=3, threads=1)
    assert Path(config.pool) == tmp_path / "pool.yaml" and config.output == tmp_path / "out"
    assert [d.n for d in config.datasets] == [3, 3] and config.threads == 1
    assert [d.label for d in config.datasets] == ["simulated/math500", "simulated/mmlu"] and config.simulated


def test_a_method_the_pool_cant_run_is_named_before_anything_runs(tmp_path):
    data = _config(tmp_path)
    data["methods"] += [
        {"name": "moa", "type": "moa", "args": {"aggregator": 7}},
        {"name": "sc", "type": "self_consistency", "args": {"worker": 9}},
    ]
    with pytest.raises(ConfigError) as caught:
        run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert "method 'moa': MixtureOfAgents: step 2: unknown worker 7" in str(caught.value)
    assert "method 'sc': SelfConsistency: step 0: unknown worker 9" in str(caught.value)
    assert _calls().total() == 0


def test_conductor_methods_get_their_lm_by_name(tmp_path, monkeypatch):
    made = []

    def scripted(model, max_tokens, temperature):
        made.append((model, max_tokens, temperature))
        return scripted_lm(lambda prompt: 'model_id = [0]\nsubtasks = ["Solve it."]\naccess_list = [[]]')

    monkeypatch.setattr(runner_config, "cached_conductor_lm", scripted)
    data = _config(tmp_path, n=2)
    data["methods"] = [
        {"name": "conductor", "type": "conductor", "args": {"lm": "local/smollm2-135m-instruct", "max_tokens": 99}},
        {"name": "router", "type": "router", "args": {"lm": "openai/gpt-4o", "temperature": 0.5}},
    ]
    records = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert ("local/smollm2-135m-instruct", 99, 0.0) in made and ("openai/gpt-4o", 384, 0.5) in made
    assert all(r["correct"] == 1.0 and r["calls"] == 1 and r["error_kind"] is None for r in records)


def test_a_conductor_method_decodes_under_the_grammar_only_with_a_local_conductor(tmp_path, monkeypatch):
    pytest.importorskip("xgrammar")
    from conductor.conductor_lm import ConductorLM, WorkflowFormat

    tiny = ConductorLM.tiny(seed=0)
    made = {"local/tiny": tiny.as_dspy_lm(max_tokens=96), "openai/gpt-4o": scripted_lm(lambda prompt: "")}
    monkeypatch.setattr(runner_config, "cached_conductor_lm", lambda model, max_tokens, temperature: made[model])
    pool = WorkerPool([ScriptedWorker("a", str), ScriptedWorker("b", str)])
    args = runner_config._ConductorArgs(lm="local/tiny", max_steps=2, grammar=True)
    program = METHODS["conductor"].build(pool, args, 0)
    assert program.orchestrate.lm.engine.logits_processor.format == WorkflowFormat(2, 2).fit(96)
    with pytest.raises(ConfigError, match="only a local or trained conductor"):
        METHODS["conductor"].build(pool, runner_config._ConductorArgs(lm="openai/gpt-4o", grammar=True), 0)


def test_a_saved_program_runs_over_the_experiments_pool(tmp_path):
    from conductor.deploy import save_program
    from conductor.modules import Conductor, WorkerPool
    from tests.deploy.helpers import fixed_lm

    title = {"kind": "tool", "tool": "string:capwords"}
    saved_pool = WorkerPool.from_config({"workers": [{"name": "a", **title}, {"name": "b", **title}]})
    workflow = 'model_id = [1]\nsubtasks = ["Solve it."]\naccess_list = [[]]'  # worker 1: "flaky" in the experiment
    save_program(Conductor(saved_pool, fixed_lm(workflow), max_steps=1), tmp_path / "saved")
    data = _config(tmp_path, n=2)
    data["methods"] = [{"name": "saved", "type": "program", "args": {"path": "saved", "trust_code": True}}]
    records = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert len(records) == 8 and _calls()["flaky"] == 8 and _calls()["oracle"] == 0
    assert all(r["correct"] == 1.0 for r in records)

    assert all(r["workflow"] == {"workers": ["flaky"], "access": [[]], "rounds": 1} for r in records)


def test_a_row_joins_a_bench_whose_saved_program_is_gone_and_a_program_never_run_is_refused(tmp_path, caplog):
    """Checkpoints are run outputs a clean clone lacks; the units recorded with them are committed. A method whose
    program folder is gone keeps its records, so a new row can be benched beside it; a run that would need the missing
    program (a unit unrecorded, or --fresh) is refused before anything runs or is cleared."""
    from conductor.deploy import save_program
    from conductor.modules import Conductor, WorkerPool
    from tests.deploy.helpers import fixed_lm

    title = {"kind": "tool", "tool": "string:capwords"}
    saved_pool = WorkerPool.from_config({"workers": [{"name": "a", **title}, {"name": "b", **title}]})
    workflow = 'model_id = [1]\nsubtasks = ["Solve it."]\naccess_list = [[]]'
    save_program(Conductor(saved_pool, fixed_lm(workflow), max_steps=1), tmp_path / "saved")
    data = _config(tmp_path, n=2)
    saved = {"name": "saved", "type": "program", "args": {"path": "saved", "trust_code": True}}
    data["methods"] = [saved]
    first = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls()["flaky"] == 8 and _calls()["oracle"] == 0

    shutil.rmtree(tmp_path / "saved")
    data["methods"] = [saved, {"name": "oracle", "type": "single", "args": {"worker": 0}}]
    records = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls()["flaky"] == 8 and _calls()["oracle"] == 8  # only the new row ran
    assert [r for r in records if r["method"] == "saved"] == first
    assert "'saved'" in caplog.text and "kept as they were recorded" in caplog.text

    results = (tmp_path / "out" / RESULTS_FILE).read_bytes()
    with pytest.raises(ConfigError, match=r"'saved': .*saved is not a saved program folder, and 8 of its 8 units"):
        run_benchmark(validate_config(data, base_dir=tmp_path), fresh=True, progress=False)
    data["methods"].append({"name": "never run", "type": "program", "args": {"path": "nowhere"}})
    with pytest.raises(ConfigError, match=r"'never run': .*nowhere is not a saved program folder") as refused:
        run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert "'saved'" not in str(refused.value)  # the gone program with every unit recorded is not a problem
    assert (tmp_path / "out" / RESULTS_FILE).read_bytes() == results and sum(_calls().values()) == 16


def test_a_saved_program_copied_back_unchanged_keeps_its_records_and_one_saved_anew_runs_again(tmp_path):
    """A checkpoint folder's files decide its units' fingerprint by content: the same program copied over itself (new
    file times, as a checkout or a compile's re-save gives) is not run again; another program saved there is."""
    from conductor.deploy import save_program
    from conductor.modules import Conductor, WorkerPool
    from tests.deploy.helpers import fixed_lm

    title = {"kind": "tool", "tool": "string:capwords"}
    saved_pool = WorkerPool.from_config({"workers": [{"name": "a", **title}, {"name": "b", **title}]})

    def save(worker: int) -> None:
        workflow = f'model_id = [{worker}]\nsubtasks = ["Solve it."]\naccess_list = [[]]'
        save_program(Conductor(saved_pool, fixed_lm(workflow), max_steps=1), tmp_path / "new")
        shutil.rmtree(tmp_path / "saved", ignore_errors=True)
        shutil.copytree(tmp_path / "new", tmp_path / "saved")
        shutil.rmtree(tmp_path / "new")

    save(1)
    data = _config(tmp_path, n=2)
    data["methods"] = [{"name": "saved", "type": "program", "args": {"path": "saved", "trust_code": True}}]
    run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls()["flaky"] == 8
    save(1)
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    (tmp_path / "saved" / "manifest.json").write_text(json.dumps({**manifest, "created": "2020-01-01T00:00:00+00:00"}))
    run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls()["flaky"] == 8 and _calls()["oracle"] == 0  # the same program saved again: nothing ran again
    save(0)
    records = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls()["oracle"] == 8 and all(r["workflow"]["workers"] == ["oracle"] for r in records)


def test_a_saved_program_is_scored_on_a_pool_it_was_not_saved_with(tmp_path):
    """``workers`` gives it the experiment's workers in another order, a subset, or more of them than it was saved
    with; indices it can't have are refused before anything runs."""
    from conductor.deploy import save_program
    from conductor.modules import Conductor, WorkerPool
    from tests.deploy.helpers import fixed_lm

    title = {"kind": "tool", "tool": "string:capwords"}
    saved_pool = WorkerPool.from_config({"workers": [{"name": "a", **title}, {"name": "b", **title}]})
    workflow = 'model_id = [1]\nsubtasks = ["Solve it."]\naccess_list = [[]]'
    save_program(Conductor(saved_pool, fixed_lm(workflow), max_steps=1), tmp_path / "saved")
    data = _config(tmp_path, n=2, seeds=[0])
    data["methods"] = [
        {"name": "reversed", "type": "program", "args": {"path": "saved", "trust_code": True, "workers": [1, 0]}},
        {"name": "trained order", "type": "program", "args": {"path": "saved", "trust_code": True}},
    ]
    records = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    used = {r["method"]: r["workflow"]["workers"] for r in records}
    assert used == {"reversed": ["oracle"], "trained order": ["flaky"]}  # model 1 is whichever worker is second

    data["methods"] = [
        {"name": "one", "type": "program", "args": {"path": "saved", "trust_code": True, "workers": [0]}}
    ]
    subset = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    # model 1 is not in a pool of one: the workflow is refused, and the fallback asks worker 0 (here "oracle")
    assert {(r["error_kind"], tuple(r["workflow"]["workers"])) for r in subset} == {("format", ("oracle",))}

    bigger = _config(tmp_path, n=2)
    bigger_pool = yaml.safe_load((tmp_path / "pool.yaml").read_text())
    bigger_pool["workers"].append({"name": "extra", **title})
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(bigger_pool))
    bigger["methods"] = [{"name": "all", "type": "program", "args": {"path": "saved", "trust_code": True}}]
    with pytest.raises(ConfigError, match="saved with 2 workers; this experiment's pool has 3"):
        run_benchmark(validate_config(bigger, base_dir=tmp_path), progress=False)
    bigger["methods"][0]["args"]["workers"] = [0, 1, 3]
    with pytest.raises(ConfigError, match=r"workers \[3\] of .* are not in this experiment's pool of 3"):
        run_benchmark(validate_config(bigger, base_dir=tmp_path), progress=False)
    bigger["methods"][0]["args"]["workers"] = [0, 0]
    with pytest.raises(ConfigError, match=r"names a worker twice: \[0, 0\]"):
        validate_config(bigger, base_dir=tmp_path)


def test_a_saved_program_under_the_grammar_gets_the_grammar_of_the_pool_and_depth_it_is_scored_with(tmp_path):
    pytest.importorskip("xgrammar")
    pytest.importorskip("peft")
    from conductor.conductor_lm import ConductorLM, WorkflowFormat, constrain_program
    from conductor.deploy import save_program
    from conductor.modules import Budget, Conductor

    title = {"kind": "tool", "tool": "string:capwords"}
    saved_pool = WorkerPool.from_config({"workers": [{"name": n, **title} for n in "abc"]})
    original = Conductor(saved_pool, ConductorLM.tiny(seed=0).as_dspy_lm(max_tokens=96), max_steps=2)
    constrain_program(original)
    save_program(original, tmp_path / "saved")
    pool = WorkerPool([ScriptedWorker(n, str) for n in "abcd"])
    build = METHODS["program"].build
    args = runner_config._ProgramArgs(path=str(tmp_path / "saved"), trust_code=True, workers=[3, 0], max_depth=1)
    program = build(pool, args, 0, budget=Budget())
    assert program.pool.names == ["d", "a"] and program.max_depth == 1
    assert program.orchestrate.lm.engine.logits_processor.format == WorkflowFormat(2, 2, conductor_step=True).fit(96)
    assert program.revise.lm.engine.logits_processor.format == WorkflowFormat(2, 2, allow_empty=True).fit(96)


# ---- running and resuming ------------------------------------------------------------------------------------------
def test_a_worker_failure_is_that_units_failure(tmp_path):
    records = run_benchmark(validate_config(_config(tmp_path), base_dir=tmp_path), progress=False)
    assert len(records) == 2 * 2 * 2 * 4  # methods x datasets x seeds x examples
    failed = [r for r in records if r["error_kind"] is not None]
    assert len(failed) == 2  # the flaky tool on FAILING_TASK, once per seed
    assert all(r["method"] == "flaky" and r["correct"] == 0.0 and r["error_kind"] == "execution" for r in failed)
    assert all("the flaky tool is down" in r["error"] for r in failed)
    assert all(r["correct"] == 1.0 and r["calls"] == 1 for r in records if r["error_kind"] is None)


def test_runs_that_name_one_replay_store_share_their_workers_samples(tmp_path):
    """A second config (another output folder, the same store) asks its replay workers nothing the first one asked;
    without the store it asks everything again."""
    data = _config(tmp_path, seeds=[0], replay_store="replay.sqlite")
    pool = yaml.safe_load((tmp_path / "pool.yaml").read_text())
    pool["workers"][0]["replay"] = True
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    first = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls()["oracle"] == 8  # one per question: 2 datasets x 4 examples
    again = run_benchmark(validate_config({**data, "output": "out2"}, base_dir=tmp_path), progress=False)
    assert _calls()["oracle"] == 8 and _comparable(again) == _comparable(first)
    alone = {k: v for k, v in data.items() if k != "replay_store"}
    run_benchmark(validate_config({**alone, "output": "out3"}, base_dir=tmp_path), progress=False)
    assert _calls()["oracle"] == 16


def test_an_exception_in_a_unit_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    single = METHODS["single"]
    question = simulated_dataset(["mmlu"], 4)[1].question

    def build(pool, args, seed, **options):
        """``single``, except that worker 1's program has a bug that shows on one question."""
        program = single.build(pool, args, seed, **options)
        if args.worker == 1:
            forward = program.forward
            program.forward = lambda **inputs: {}["a bug"] if inputs["question"] == question else forward(**inputs)
        return program

    monkeypatch.setitem(METHODS, "single", MethodType(single.args, build))
    records = run_benchmark(validate_config(_config(tmp_path), base_dir=tmp_path), progress=False)
    raised = [r for r in records if r["error_kind"] == "exception"]
    assert len(raised) == 2 and all(r["method"] == "flaky" and r["error"] == "KeyError: 'a bug'" for r in raised)
    assert all(r["correct"] == 0.0 for r in raised)
    assert sum(r["error_kind"] == "execution" for r in records) == 2  # the flaky tool's own failure still shows


def test_a_killed_run_resumes_without_recomputing_finished_units(tmp_path, monkeypatch):
    """Kill the run after 5 units are recorded; the rerun runs only the others and ends where an uninterrupted run
    ends."""
    config = validate_config(_config(tmp_path), base_dir=tmp_path)
    append = ResultsFile.append
    recorded = []

    def append_then_die(self, record):
        if len(recorded) == 5:
            raise KeyboardInterrupt  # as if the process were killed
        append(self, record)
        recorded.append(record)

    monkeypatch.setattr(ResultsFile, "append", append_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(config, progress=False)
    for thread in threading.enumerate():  # let the units in flight finish: the killed process took them along
        if thread.name.startswith("bench"):
            thread.join()
    monkeypatch.setattr(ResultsFile, "append", append)
    assert len(ResultsFile(config.output / RESULTS_FILE).read()) == 5

    _calls().clear()
    resumed = run_benchmark(config, progress=False)
    assert _calls().total() == 32 - 5  # one tool call per unit, none for the 5 recorded ones

    fresh = validate_config(_config(tmp_path, output="fresh"), base_dir=tmp_path)
    assert _comparable(resumed) == _comparable(run_benchmark(fresh, progress=False))


def test_a_run_killed_with_sigkill_resumes(tmp_path):
    config_path = _write(tmp_path, _config(tmp_path, tool="slow_oracle", n=10, threads=1))
    results = tmp_path / "out" / RESULTS_FILE
    command = [sys.executable, "-m", "conductor.cli", "bench", str(config_path), "--no-progress"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while (not results.is_file() or len(results.read_bytes().splitlines()) < 6) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    with open(results, "ab") as file:
        file.write(b'{"method": "oracle", "datas')  # a line torn by the kill
    done = len(ResultsFile(results).read())
    assert 6 <= done < 80

    records = run_benchmark(load_config(config_path), progress=False)
    assert _calls()["oracle"] + _calls()["flaky"] == 80 - done
    assert len(records) == 80 and len({(r["method"], r["dataset"], r["seed"], r["example_id"]) for r in records}) == 80
    assert len(ResultsFile(results).read()) == 80  # the torn line was skipped, the next record began a new line


def test_a_changed_method_is_recomputed_on_resume(tmp_path):
    data = _config(tmp_path)
    run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    data["methods"][1]["args"]["worker"] = 0
    _calls().clear()
    records = run_benchmark(validate_config(data, base_dir=tmp_path), progress=False)
    assert _calls() == Counter({"oracle": 16})  # only the changed method ran again
    assert all(r["correct"] == 1.0 for r in records)
    results = ResultsFile(tmp_path / "out" / RESULTS_FILE)
    assert len(results.read()) == 32 + 16  # the file keeps the records the rerun replaced
    unit = itemgetter("method", "dataset", "seed", "example_id")
    latest = sorted(_comparable(results.latest()), key=unit)
    assert latest == sorted(_comparable(records), key=unit)  # each unit once, as last run


# ---- statistics and reports ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "successes, n, low, high",
    [
        (81, 263, 0.2553, 0.3662),  # the worked example of Wilson's interval, e.g. in Newcombe (1998)
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
    ],
)
def test_wilson_interval(successes, n, low, high):
    got = wilson_interval(successes, n)
    assert got == pytest.approx((low, high), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_the_wilson_interval_holds_the_observed_share_at_every_count():
    """At 0 or n successes the bounds computed in floating point can land a hair past the share (0 of 7 gave a lower
    bound above 0), which made the plot's error bars negative and failed a 1,200-unit run at its report."""
    for n in range(1, 201):
        for k in range(n + 1):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)


def test_the_report_has_one_row_per_method_and_says_simulated(tmp_path):
    config = load_config(_write(tmp_path, _config(tmp_path)))
    paths = write_report(config, run_benchmark(config, progress=False))
    table = paths["table"].read_text()
    assert table.startswith("# SIMULATED: test\n") and "Every number here is SIMULATED" in table
    sections = table.split("\n## ")
    header = "| method | n | accuracy % [95% CI] | $ / question | tokens / question | calls / question | error rate |"
    overall = [line for line in sections[1].splitlines() if line.startswith("|")]
    assert overall[0] == header and overall[1].count("|") == header.count("|")
    assert [row.split(" | ")[0] for row in overall[2:]] == ["| oracle", "| flaky"]
    assert overall[2].startswith("| oracle | 16 | 100.0 [80.6, 100.0] | 0 |")
    assert overall[3].startswith("| flaky | 16 | 87.5 [64.0, 96.5] | 0 |") and overall[3].endswith("| 12.5% |")
    by_dataset = [line for line in sections[2].splitlines() if line.startswith("|")]
    assert by_dataset[0] == f"| method | simulated/math500 | simulated/mmlu | {ALL} |"
    per_dataset = [line for line in sections[3].splitlines() if line.startswith("|")]
    assert len(per_dataset) == 2 + 2 * 2
    shapes = [line for line in sections[4].splitlines() if line.startswith("|")]
    assert sections[4].startswith("Workflow shapes") and len(shapes) == 2 + 2 * 2
    assert shapes[1] == "| --- | --- | --: | --: | --: | --: | --- |"  # the workflows are text
    assert shapes[2] == "| oracle | simulated/math500 | 8 | 0 | 1.00 | 1.00 | `oracle[]` 100% |"
    data = json.loads(paths["results"].read_text())
    assert data["simulated"] and data["units"] == 32 and len(data["overall"]) == 2 and len(data["per_dataset"]) == 4
    assert len(data["workflow_shapes"]) == 4
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summarise_pools_datasets_and_seeds():
    records = [
        {"method": "m", "dataset": d, "correct": c, "cost": 0.5, "tokens": 10, "calls": 2, "latency_s": 1.0,
         "error_kind": e}
        for d, c, e in [("a", 1.0, None), ("a", 0.0, "execution"), ("b", 1.0, "format"), ("b", 1.0, None)]
    ]  # fmt: skip
    overall, per_dataset = summarise(records, ["m"], ["a", "b"])
    assert [(a.dataset, a.n, a.accuracy) for a in per_dataset] == [("a", 2, 0.5), ("b", 2, 1.0)]
    (total,) = overall
    assert (total.dataset, total.n, total.accuracy, total.error_rate) == (ALL, 4, 0.75, 0.5)
    assert total.errors == {"execution": 1, "format": 1} and total.cost == 0.5 and total.calls == 2
    assert (total.ci_low, total.ci_high) == pytest.approx(wilson_interval(3, 4))
    assert math.isclose(total.tokens, 10)


def test_workflow_shapes_count_steps_access_and_rounds_per_method_and_dataset():
    def unit(method, dataset, workers=None, access=None, rounds=1):
        workflow = None if workers is None else {"workers": workers, "access": access, "rounds": rounds}
        return {"method": method, "dataset": dataset, "workflow": workflow}

    two_step = (["gemma", "check"], [[], "all"])
    records = [
        unit("conductor", "a", *two_step),
        unit("conductor", "a", *two_step),
        unit("conductor", "a", ["gemma"], [[]]),
        unit("conductor", "a"),  # no workflow ran (refused input)
        unit("conductor", "b", ["smollm2", "gemma", "vote"], [[], [0], [0, 1]], rounds=2),
        {"method": "old record", "dataset": "a"},  # written before records had workflows
    ]
    a, b = workflow_shapes(records, ["conductor", "old record", "absent"], ["a", "b"])
    assert (a.n, a.ran, a.multi_step, a.steps, a.rounds) == (4, 3, 0.5, pytest.approx(5 / 3), 1.0)
    assert a.common == [("gemma[] -> check[all]", pytest.approx(2 / 3)), ("gemma[]", pytest.approx(1 / 3))]
    assert (b.n, b.multi_step, b.steps, b.rounds) == (1, 1.0, 3.0, 2.0)
    assert b.common == [("smollm2[] -> gemma[0] -> vote[0,1] (2 rounds)", 1.0)]
    assert shape_text({"workers": ["x"], "access": ["all"], "rounds": 1}) == "x[all]"


# ---- command line --------------------------------------------------------------------------------------------------
def test_the_command_runs_a_config_and_resumes(tmp_path, capsys):
    path = _write(tmp_path, _config(tmp_path, n=1))
    assert conductor_main(["bench", str(path), "--no-progress"]) == 0
    assert "| oracle | 4 | 100.0" in capsys.readouterr().out
    _calls().clear()
    assert conductor_main(["bench", str(path), "--no-progress"]) == 0 and _calls().total() == 0
    assert conductor_main(["bench", str(path), "--fresh", "--no-progress"]) == 0 and _calls().total() == 8


def test_a_bad_config_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    data = _config(tmp_path)
    data["methods"][0]["args"] = {"worker": -1}
    assert conductor_main(["bench", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "args.worker: Input should be greater than or equal to 0" in err and "Traceback" not in err


def test_a_saved_program_keeps_the_framing_compile_chose_on_the_experiments_workers(tmp_path, monkeypatch):
    """Compile tunes each model's framing: a saved program's model asked plain is asked plain over the experiment's
    worker of the same name, in any order or subset; the experiment's pool is left as it was."""
    from conductor.deploy import save_program
    from conductor.modules import Budget, Conductor
    from tests.deploy.helpers import fixed_lm
    from tests.modules.framing import MIXED_POOL, config_models

    config_models(monkeypatch)
    saved = WorkerPool.from_config(MIXED_POOL).framed({"chat": "plain"})
    workflow = 'model_id = [0]\nsubtasks = ["all"]\naccess_list = [[]]'
    save_program(Conductor(saved, fixed_lm(workflow), max_steps=1), tmp_path / "saved")
    experiment = WorkerPool.from_config(MIXED_POOL)
    for workers, framings in ((None, ["plain", "task", "task"]), ([2, 0], ["task", "plain"])):
        args = runner_config._ProgramArgs(path=str(tmp_path / "saved"), trust_code=True, workers=workers)
        program = runner_config.saved_program(experiment, args, 0, Budget())
        assert [w.framing for w in program.pool] == framings
    assert [w.framing for w in experiment] == ["task", "task", "task"]
