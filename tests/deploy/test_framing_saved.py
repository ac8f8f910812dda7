"""A worker's framing is part of the saved pool: it comes back on load, and a bad one in a program file is a clear
``ConfigError``. (The programs load with ``trust_code``: their scripted conductor LM is the tests' own code.)"""

from __future__ import annotations

import json

import pytest

from conductor import Conductor, ConfigError, WorkerPool
from conductor.deploy import load_program, save_program
from tests.deploy.helpers import fixed_lm
from tests.modules.framing import config_models

QUESTION = "What is the capital of France?"
POOL = {
    "workers": [
        {"name": "chat", "kind": "local", "model": "plainspoken", "framing": "plain"},
        {"name": "formal", "kind": "local", "model": "formal"},
    ]
}
WORKFLOW = 'model_id = [0]\nsubtasks = ["all"]\naccess_list = [[]]'


def saved(tmp_path, pool: WorkerPool):
    return save_program(Conductor(pool, fixed_lm(WORKFLOW)), tmp_path / "program")


def test_a_framing_round_trips_through_save_and_load(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_models(monkeypatch)
    folder = saved(tmp_path, WorkerPool.from_config(POOL))
    assert [w["framing"] for w in json.loads((folder / "pool.json").read_text())["workers"]] == ["plain", "task"]
    loaded = load_program(folder, trust_code=True)
    assert [w.framing for w in loaded.pool] == ["plain", "task"]
    assert loaded(question=QUESTION).answer == "Paris"  # the plainspoken model was asked the question alone


def test_a_framing_set_after_the_config_is_saved_too(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_models(monkeypatch)
    task_only = {"workers": [{**w, "framing": "task"} for w in POOL["workers"]]}
    folder = saved(tmp_path, WorkerPool.from_config(task_only).framed({"chat": "plain"}))
    assert [w.framing for w in load_program(folder, trust_code=True).pool] == ["plain", "task"]


@pytest.mark.parametrize(
    ("worker", "message"),
    [
        ({"name": "chat", "kind": "local", "model": "plainspoken", "framing": "chatty"}, "framing"),
        ({"name": "calc", "kind": "tool", "tool": "calculator", "framing": "plain"}, "an option of models"),
    ],
)
def test_a_bad_framing_in_a_saved_pool_is_a_clear_error(tmp_path, monkeypatch, worker, message) -> None:
    config_models(monkeypatch)
    folder = saved(tmp_path, WorkerPool.from_config(POOL))
    (folder / "pool.json").write_text(json.dumps({"workers": [worker]}))
    with pytest.raises(ConfigError, match=message):
        load_program(folder, trust_code=True)
