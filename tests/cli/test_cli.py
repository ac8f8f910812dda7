import json
import socket
from pathlib import Path

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
def fallback_pool_file(tmp_path):
    """POOL with the calculator's failed steps handed to `upper`."""
    path = tmp_path / "fallback_pool.yaml"
    path.write_text(POOL.replace("tool: calculator}", "tool: calculator, fallbacks: [upper]}"))
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


def test_run_names_the_fallback_that_answered_a_failed_step(fallback_pool_file, conductor_says, capsys):
    conductor_says('model_id = [1]\nsubtasks = ["name three colors"]\naccess_list = [[]]')
    assert main(["run", "Name three colors.", "--pool", fallback_pool_file]) == 0
    out = capsys.readouterr().out  # the calculator finds no arithmetic; its fallback answers the step
    assert "Step 0 · calc, answered by upper · solve" in out and "Answer: " in out and "execution error" not in out


def test_pool_lists_each_workers_fallbacks(fallback_pool_file, capsys):
    assert main(["pool", "--pool", fallback_pool_file, "--json"]) == 0
    assert [w["fallbacks"] for w in json.loads(capsys.readouterr().out)["workers"]] == [[], ["upper"]]
    assert main(["pool", "--pool", fallback_pool_file]) == 0
    assert "retries, then upper" in capsys.readouterr().out


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


def test_version(capsys):
    from conductor import __version__

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.strip() == f"conductor (dspy-conductor) {__version__}"


def test_pool_lists_the_pool_run_uses_by_default(capsys):
    assert main(["pool", "--json"]) == 0
    workers = json.loads(capsys.readouterr().out)["workers"]
    assert [w["name"] for w in workers] == ["smollm2", "gemma", "python", "calculator"]
    assert [w["max_tokens"] for w in workers[:2]] == [256, 256]  # free-form answers are not cut mid-sentence


def test_pool_lists_a_saved_programs_pool_only_when_trusted(tmp_path, capsys):
    import conductor
    from tests.deploy.helpers import compiled_program

    folder = conductor.save(compiled_program(), tmp_path / "saved")
    assert main(["pool", "--program", str(folder)]) == 2
    assert "is not trusted" in " ".join(capsys.readouterr().err.split())  # its pool names a tool by import path
    assert main(["pool", "--program", str(folder), "--trust-code", "--json"]) == 0
    assert [w["name"] for w in json.loads(capsys.readouterr().out)["workers"]] == ["title", "calc"]


def test_serve_defaults_to_the_shipped_program_and_keeps_its_audit_log_in_the_data_folder(
    monkeypatch, tmp_path, capsys
):
    from conductor.cli import _serve
    from conductor.deploy import TRAINED_PROGRAM
    from tests.deploy.helpers import compiled_program

    seen = {}

    class Uvicorn:  # records what the server would run: the app, on a socket already bound
        class Config:
            def __init__(self, app, **options):
                seen.update(app=app, config=options)

        class Server:
            def __init__(self, config):
                pass

            def run(self, sockets):
                seen["port"] = sockets[0].getsockname()[1]
                seen["collector_tuned"] = seen.get("tuned", False)

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(_serve, "tune_gc_for_serving", lambda: seen.update(tuned=True))  # process-wide: not here
    monkeypatch.setattr(_serve, "load_program", lambda folder, trust_code: seen.update(folder=folder) or program)
    monkeypatch.setattr(_serve, "create_app", lambda program, **options: seen.update(options) or "the app")
    monkeypatch.setattr(_serve, "import_serving", lambda name: Uvicorn)
    program = compiled_program()
    assert main(["serve", "--port", "0"]) == 0  # 0: a free port, which the message must then name
    assert seen["folder"] == TRAINED_PROGRAM and seen["model"] == "local-routing"
    assert Path(seen["audit_db"]) == tmp_path / "dspy-conductor" / "audit" / "local-routing.sqlite"
    assert seen["app"] == "the app" and seen["port"] == seen["config"]["port"] > 0 and seen["collector_tuned"]
    assert f"Serving 'local-routing' at http://127.0.0.1:{seen['port']}/v1" in " ".join(capsys.readouterr().err.split())
    assert seen["docs"] is False and seen["body_timeout_s"] == 30.0  # the API docs are off unless asked for
    assert main(["serve", "--port", "0", "--docs", "--body-timeout", "5"]) == 0
    assert seen["docs"] is True and seen["body_timeout_s"] == 5.0


def test_serve_on_a_taken_port_names_it_and_the_flag_to_change(monkeypatch, capsys):
    pytest.importorskip("uvicorn")
    from conductor.cli import _serve
    from tests.deploy.helpers import compiled_program

    monkeypatch.setattr(_serve, "load_program", lambda folder, trust_code: compiled_program())
    monkeypatch.setattr(_serve, "create_app", lambda program, **options: "the app")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2  # bad input, as `conductor --help` says
    err = " ".join(capsys.readouterr().err.split())
    assert f"can't listen on 127.0.0.1:{port}: Address already in use: choose another port with --port" in err
    assert "Serving" not in err


def test_the_pool_table_keeps_every_name_whole_at_80_columns(monkeypatch, capsys):
    from rich.console import Console

    from conductor.cli import _pool

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(_pool, "console", Console())  # made as a new process makes it: 80 columns, from COLUMNS
    assert main(["pool"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) == 80
    assert "…" not in out  # nothing cut short
    for whole in ("smollm2", "gemma", "python", "calculator", "Calculator", "Python", "Evaluates", "arithmetic"):
        assert whole in out, whole


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (3, 1), (8, 4), (64, 32)])
def test_default_torch_threads_leave_a_small_machine_room(monkeypatch, cores, threads):
    from conductor import cli

    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert cli.default_threads() == threads


def test_threads_flag_sets_torch_threads(monkeypatch):
    torch = pytest.importorskip("torch")
    from tests.deploy.helpers import compiled_program

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # restored afterwards
    monkeypatch.setattr(_run, "_saved", lambda args: compiled_program())
    before = torch.get_num_threads()
    try:
        main(["run", "What is 17 * 23 + 4?", "--threads", "2", "--json"])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_normal_output_shows_only_the_librarys_own_warnings(capsys, monkeypatch):
    import logging
    import warnings

    from conductor.cli import configure_logging

    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(name, "")  # restored afterwards
    warnings.simplefilter("always")  # (pytest restores the filters) the same warning twice

    def log_everything():
        logging.getLogger("conductor.local").warning("converting a model once")
        logging.getLogger("some_library").warning("library noise")
        logging.getLogger("LiteLLM").warning("litellm banner")
        warnings.warn("peft noise", UserWarning, stacklevel=1)

    try:
        configure_logging(verbose=False)
        log_everything()
        quiet = capsys.readouterr().err
        configure_logging(verbose=True)
        log_everything()
        verbose = capsys.readouterr().err
    finally:
        configure_logging(verbose=False)
        logging.captureWarnings(False)
    assert "converting a model once" in quiet and "noise" not in quiet and "banner" not in quiet
    assert "library noise" in verbose and "litellm banner" in verbose, verbose


@pytest.mark.parametrize(
    ("argv", "verbose"), [(["pool"], False), (["-v", "pool"], True), (["pool", "--verbose"], True)]
)
def test_verbose_is_taken_before_or_after_the_subcommand(monkeypatch, capsys, argv, verbose):
    import conductor.cli as cli

    seen = []
    monkeypatch.setattr(cli, "configure_logging", seen.append)
    assert cli.main(argv) == 0
    assert seen == [verbose]


def test_the_top_level_help_is_for_users(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "writes and runs workflows" in out and "Exit codes" in out
    assert "One file per subcommand" not in out  # the package's docstring is for its developers
