"""What a new user meets in a run config (``conductor train/eval/compile/search CONFIG``) and an experiment config:
paths relative to the config file, and errors that say how to fix them (the metric names, a data file's columns, the
nearest key to a misspelled one)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conductor.bench import validate_config
from conductor.bench.datasets import DataFile
from conductor.cli import load_run_config
from conductor.errors import ConfigError

POOL = {"workers": [{"name": "calc", "kind": "tool", "tool": "calculator"}]}


@pytest.fixture(autouse=True)
def _offline(offline_in_a_fresh_cache: None) -> None:
    """Every test here reads local files only."""


def write(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_run_config(path)
    return str(caught.value)


# ---- paths -----------------------------------------------------------------------------------------------------------
def test_a_run_config_s_paths_are_relative_to_its_folder_not_the_working_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project" / "configs"
    write(folder / "pool.yaml", POOL)
    (folder / "questions.jsonl").write_text('{"question": "1 + 1?", "answer": 2}\n')
    (folder / "models" / "mine").mkdir(parents=True)
    config = {
        "program": {"pool": "pool.yaml", "conductor": "models/mine"},
        "data": {"file": {"path": "questions.jsonl"}, "metric": "number"},
        "grpo": {"steps": 1},
        "output_dir": "../runs/first",
    }
    path = write(folder / "run.yaml", config)
    monkeypatch.chdir(tmp_path)  # elsewhere: the config must mean the same files
    loaded = load_run_config(path.relative_to(tmp_path))
    assert loaded.program.pool == str(folder / "pool.yaml")
    assert loaded.program.conductor == str(folder / "models" / "mine")
    assert loaded.data.file.path == folder / "questions.jsonl"
    assert loaded.output_dir == tmp_path / "project" / "runs" / "first"
    assert loaded.grpo.output_dir == loaded.output_dir  # GRPO writes where the config says, not beside the caller
    assert [e.answer for e in loaded.data.examples()] == ["2"]


def test_names_stay_names(tmp_path: Path) -> None:
    config = {"program": {"pool": "default", "conductor": "tiny"}, "data": {"loader": "m:f"}, "output_dir": "out"}
    loaded = load_run_config(write(tmp_path / "run.yaml", config))
    assert (loaded.program.pool, loaded.program.conductor) == ("default", "tiny")


def test_a_missing_pool_file_names_where_it_was_looked_for(tmp_path: Path) -> None:
    config = {"program": {"pool": "pools/mine.yaml"}, "data": {"loader": "m:f"}, "output_dir": "out"}
    message = config_error(write(tmp_path / "run.yaml", config))
    assert f"program.pool: the pool file {tmp_path / 'pools' / 'mine.yaml'} does not exist" in message


# ---- a metric's name -------------------------------------------------------------------------------------------------
def test_a_misspelled_metric_lists_the_metrics_and_the_nearest_one(tmp_path: Path) -> None:
    message = config_error(write(tmp_path / "run.yaml", {"data": {"loader": "m:f", "metric": "numbr"}}))
    assert (
        "data.metric: unknown metric 'numbr' (did you mean 'number'?): name one of exact, number, choice, contains, "
        "or a function of your own as 'module:function'"
    ) in message
    assert "pattern" not in message


def test_a_bench_file_s_metric_gets_the_same_message(tmp_path: Path) -> None:
    dataset = {"name": "file", "args": {"path": "q.jsonl", "metric": "contain"}, "n": 1}
    with pytest.raises(ConfigError, match=r"args\.metric: unknown metric 'contain' \(did you mean 'contains'\?\)"):
        validate_config({"datasets": [dataset], "methods": [{"name": "one", "type": "single"}], "output": "out"})


# ---- a data file's columns -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_missing_column_lists_the_columns_found_and_those_expected(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"quiz{suffix}"
    if suffix == ".jsonl":
        path.write_text('{"Question": "1 + 1?", "solution": 2}\n{"Question": "2 + 2?", "solution": 4}\n')
    else:
        path.write_text("Question,solution\n1 + 1?,2\n")
    expected = (
        f"quiz{suffix} has no column 'question' (did you mean 'Question'?), 'answer': its columns are "
        "['Question', 'solution'], and ['question', 'answer'] were expected"
    )
    with pytest.raises(ConfigError, match=re.escape(expected)):
        DataFile(path=path).read()
    rows = DataFile(path=path, inputs=["Question"], answer="solution").read()  # the fix the message names
    assert rows.examples[0].question == "1 + 1?"


def test_a_parquet_file_s_missing_option_column_is_named(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "quiz.parquet"
    pandas.DataFrame({"question": ["Largest?"], "answer": ["B"], "choices": [["Mars", "Jupiter"]]}).to_parquet(path)
    with pytest.raises(ConfigError, match=r"no column 'choice' \(did you mean 'choices'\?\)"):
        DataFile(path=path, options="choice").read("choice")


# ---- misspelled keys -------------------------------------------------------------------------------------------------
def test_a_misspelled_key_gets_the_nearest_field_at_any_depth(tmp_path: Path) -> None:
    config = {
        "progam": {},
        "data": {"loader": "m:f", "file_": 1, "nn": 3},
        "grpo": {"stepz": 2, "reward": {"cost_penalti": 1}},
        "compile": {"budget_space": {"max_step": [1, 2]}},
        "outptu_dir": "out",
        "zzzz": 1,
    }
    message = config_error(write(tmp_path / "run.yaml", config))
    for line in (
        "progam: Extra inputs are not permitted (did you mean 'program'?)",
        "data.file_: Extra inputs are not permitted (did you mean 'file'?)",
        "grpo.stepz: Extra inputs are not permitted (did you mean 'steps'?)",
        "grpo.reward.cost_penalti: Extra inputs are not permitted (did you mean 'cost_penalty'?)",
        "outptu_dir: Extra inputs are not permitted (did you mean 'output_dir'?)",
        "zzzz: Extra inputs are not permitted\n",
    ):
        assert line in message + "\n", (line, message)
    assert "compile.budget_space.max_step: Extra inputs are not permitted (did you mean" in message


def test_an_experiment_config_s_misspelled_keys_get_the_nearest_field_too() -> None:
    config = {
        "datasets": [{"name": "bigbench", "args": {"tsk": "arithmetic"}, "n": 1}],
        "methods": [
            {"name": "one", "type": "single", "args": {"wroker": 0}},
            {"name": "two", "type": "moa", "budgt": {}},
        ],
        "output": "out",
        "seed": [0],
    }
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    message = str(caught.value)
    for line in (
        "args.tsk: Extra inputs are not permitted (did you mean 'task'?)",
        "args.wroker: Extra inputs are not permitted (did you mean 'worker'?)",
        "methods.1.budgt: Extra inputs are not permitted (did you mean 'budget'?)",
        "seed: Extra inputs are not permitted (did you mean 'seeds'?)",
    ):
        assert line in message, (line, message)
