import json

import pytest

from conductor.cli import _common, _run, main
from conductor.testing import scripted_lm

POOL = """
workers:
  - {name: upper, kind: tool, tool: "string:capwords"}
  - {name: calc, kind: tool, tool: calculator}
"""
WORKFLOW = 'model_id = [1]\nsubtasks = ["17 * 23 + 4"]\naccess_list = [[]]'


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(_common.console, "width", 200)  # no wrapping inside the strings the tests look for


@pytest.fixture
def pool_file(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text(POOL)
    return str(path)


@pytest.fixture
def conductor_says(monkeypatch):
    def script(*texts):
        lm = scripted_lm(list(texts))
        monkeypatch.setattr(_run, "conductor_lm", lambda model, **kwargs: lm)
        return lm

    return script


def test_run_prints_workflow_steps_and_answer(pool_file, conductor_says, capsys):
    conductor_says(WORKFLOW)
    assert main(["run", "What is 17 * 23 + 4?", "--pool", pool_file]) == 0
    err = capsys.readouterr().out
    assert "Workflow" in err and "1 (calc)" in err and "Answer: 395" in err


def test_run_json_carries_the_whole_prediction(pool_file, conductor_says, capsys):
    conductor_says(WORKFLOW)
    assert main(["run", "What is 17 * 23 + 4?", "--pool", pool_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answer"] == "395" and out["error"] is None
    assert out["steps"][0]["worker"] == "calc" and out["workflow"].startswith("model_id = [1]")


def test_run_with_an_unusable_workflow_shows_the_conductor_text_and_the_fallback(pool_file, conductor_says, capsys):
    conductor_says("I don't know how to write lists.")
    assert main(["run", "hello there", "--pool", pool_file]) == 0
    err = capsys.readouterr().out
    assert "unusable" in err and "missing list: model_id" in err and "Fallback" in err and "Hello There" in err


def test_run_with_an_empty_question_fails_cleanly(pool_file, conductor_says, capsys):
    conductor_says()
    assert main(["run", "  ", "--pool", pool_file]) == 1
    assert "the question is empty" in capsys.readouterr().out


def test_bad_pool_file_is_one_clear_line(tmp_path, capsys):
    path = tmp_path / "pool.yaml"
    path.write_text("workers: [{name: x, kind: lm}]")
    assert main(["pool", "--pool", str(path)]) == 2
    err = capsys.readouterr().err
    assert "needs `model`" in err and "Traceback" not in err


def test_pool_lists_workers(pool_file, capsys):
    assert main(["pool", "--pool", pool_file, "--json"]) == 0
    assert [w["name"] for w in json.loads(capsys.readouterr().out)["workers"]] == ["upper", "calc"]


def test_default_pool_listing(capsys):
    assert main(["pool"]) == 0
    assert "smollm2" in capsys.readouterr().out


def test_run_answers_with_a_saved_program_and_its_own_pool(tmp_path, capsys):
    import conductor
    from tests.deploy.helpers import compiled_program

    conductor.save(compiled_program(), tmp_path / "saved")
    assert main(["run", "What is 17 * 23 + 4?", "--program", str(tmp_path / "saved"), "--json", "--trust-code"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answer"] == 395 and [s["worker"] for s in out["steps"]] == ["title", "calc"]  # its `answer: int`


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-steps", "2"], "--max-steps shape(s) a fresh conductor"),
        (["--free", "--temperature", "0.5"], "--free, --temperature shape(s) a fresh conductor"),
        (["--conductor", "openai/gpt-4o"], "--program runs a saved program"),
    ],
)
def test_run_refuses_options_a_saved_program_cannot_take(tmp_path, capsys, extra, message):
    assert main(["run", "2 + 2", "--program", str(tmp_path), *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "budget"),
    [
        (["--max-tokens", "777"], {"max_tokens": 777, "max_cost": 1.0}),
        (["--max-cost", "0.5"], {"max_tokens": 5_000, "max_cost": 0.5}),
        (["--max-tokens", "0", "--max-cost", "0"], {"max_tokens": 0, "max_cost": 0}),
    ],
)
def test_a_budget_flag_changes_only_the_limit_it_names(monkeypatch, flags, budget):
    from conductor.modules import Budget
    from tests.deploy.helpers import compiled_program

    program = compiled_program()  # its own budget: 5,000 tokens and $1
    monkeypatch.setattr(_run, "_saved", lambda args: program)
    main(["run", "What is 17 * 23 + 4?", *flags, "--json"])
    assert program.executor.budget == Budget(**budget)


@pytest.mark.parametrize("flags", [["--max-cost", "nan"], ["--max-cost", "inf"], ["--max-tokens", "-5"]])
def test_a_budget_flag_that_is_no_limit_is_one_clear_line(monkeypatch, capsys, flags):
    from tests.deploy.helpers import compiled_program

    monkeypatch.setattr(_run, "_saved", lambda args: compiled_program())
    assert main(["run", "2 + 2", *flags]) == 2
    err = capsys.readouterr().err
    assert "invalid budget:" in err and "Traceback" not in err
