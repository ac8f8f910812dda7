"""Bad input at every entry point of the CLI and the library: a clear error, never a traceback.

The CLI answers with a one-line ``error:`` (exit code 2, or 1 for a question the run refused) and no traceback; the
library raises a ``ConductorError`` or returns the refusal as the prediction's ``input`` error. The server's cases
are in ``tests/deploy``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import dspy
import pytest

import conductor
from conductor import Budget, Conductor, WorkerPool
from conductor.cli import _common, main
from conductor.errors import ConductorError, WorkflowError
from conductor.modules import Workflow
from conductor.testing import scripted_lm
from tests.deploy.helpers import compiled_program

CONDUCTOR = Path(sys.executable).with_name("conductor")
POOL = "workers:\n  - {name: calc, kind: tool, tool: calculator}\n"
RUN_CONFIG = "data: {loader: 'conductor.bench.datasets:load_gsm8k', metric: 'os:getcwd'}\noutput_dir: out\n"
NOT_UTF8 = b'{"workers": "\xff\xfe"}'


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setattr(_common.console, "width", 200)
    monkeypatch.setattr(_common.status, "width", 200)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A saved program (its pool names a tool by import path: it runs with --trust-code)."""
    return conductor.save(compiled_program(), tmp_path_factory.mktemp("programs") / "good")


def corrupted(saved: Path, where: Path, file: str, change: Callable[[str], str | bytes] | None) -> Path:
    """A copy of ``saved`` whose ``file`` is ``change``d from its text (``None``: deleted)."""
    folder = where / "program"
    shutil.copytree(saved, folder)
    if change is None:
        (folder / file).unlink()
        return folder
    content = change((folder / file).read_text())
    (folder / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


def edit_json(**changes) -> Callable[[str], str]:
    return lambda text: json.dumps(json.loads(text) | changes)


def edit_predictors(**changes) -> Callable[[str], str]:
    """program.json with ``changes`` in every predictor's state."""

    def edit(text: str) -> str:
        state = json.loads(text)
        return json.dumps({k: v | changes if isinstance(v, dict) and "demos" in v else v for k, v in state.items()})

    return edit


def assert_clean_error(code: int, err: str, message: str, expected_code: int = 2) -> None:
    """One clear error: the exit code, the message, no traceback and no 'internal error' (an unexpected exception)."""
    assert code == expected_code, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert message in " ".join(err.split()), err


# ---- saved programs, corrupted in every file -------------------------------------------------------------------
CORRUPTIONS = {
    "manifest truncated": ("manifest.json", lambda t: t[: len(t) // 2], "manifest.json can't be read"),
    "manifest not an object": ("manifest.json", lambda t: "[1, 2]", "manifest.json must hold a JSON object"),
    "manifest not UTF-8": ("manifest.json", lambda t: NOT_UTF8, "manifest.json can't be read"),
    "manifest empty": ("manifest.json", lambda t: "", "manifest.json can't be read"),
    "manifest missing": ("manifest.json", None, "manifest.json is missing"),
    "manifest of another format": ("manifest.json", edit_json(format="x"), "this library reads"),
    "manifest newer version": ("manifest.json", edit_json(format_version=99), "version 99"),
    "conductor_lm a string": ("manifest.json", edit_json(conductor_lm="x"), "conductor_lm must be an object"),
    "conductor_lm null": ("manifest.json", edit_json(conductor_lm=None), "conductor_lm must be an object"),
    "conductor_lm unknown kind": ("manifest.json", edit_json(conductor_lm={"kind": "x"}), "whose kind is"),
    "policy without folder": ("manifest.json", edit_json(conductor_lm={"kind": "policy"}), "lacks folder (str)"),
    "dspy_lm without state": (
        "manifest.json",
        edit_json(conductor_lm={"kind": "dspy_lm", "model": "m", "state": [1]}),
        "lacks state (dict)",
    ),
    "max_steps a word": ("manifest.json", edit_json(max_steps="many"), "invalid program options: max_steps"),
    "roles a number": ("manifest.json", edit_json(roles=5), "invalid program options: roles"),
    "budget NaN": ("manifest.json", edit_json(budget={"max_cost": math.nan}), "invalid program options"),
    "pool truncated": ("pool.json", lambda t: t[: len(t) // 2], "pool.json can't be read"),
    "pool not an object": ("pool.json", lambda t: '"workers"', "pool.json must hold a JSON object"),
    "pool not UTF-8": ("pool.json", lambda t: NOT_UTF8, "pool.json can't be read"),
    "pool missing": ("pool.json", None, "pool.json is missing"),
    "pool workers a string": ("pool.json", edit_json(workers="x"), "workers: Input should be a valid list"),
    "pool worker of wrong types": (
        "pool.json",
        edit_json(workers=[{"name": 5, "kind": "tool", "tool": "calculator", "max_tokens": "x"}]),
        "workers.0.name: Input should be a valid string",
    ),
    "program truncated": ("program.json", lambda t: t[: len(t) // 2], "program.json can't be loaded"),
    "program not an object": ("program.json", lambda t: "[1]", "program.json can't be loaded"),
    "program not UTF-8": ("program.json", lambda t: NOT_UTF8, "program.json can't be loaded"),
    "program missing": ("program.json", None, "program.json is missing"),
    "program demos a string": ("program.json", edit_predictors(demos="x"), "program.json can't be loaded"),
}


@pytest.mark.parametrize(("file", "change", "message"), CORRUPTIONS.values(), ids=CORRUPTIONS)
def test_a_corrupted_program_is_one_clear_line(saved, tmp_path, capsys, file, change, message):
    folder = corrupted(saved, tmp_path, file, change)
    code = main(["run", "What is 17 * 23 + 4?", "--program", str(folder), "--trust-code"])
    assert_clean_error(code, capsys.readouterr().err, message)
    with pytest.raises(ConductorError, match=re.escape(message.split(":")[0])):  # the library says the same
        conductor.load(folder, trust_code=True)


# ---- the command line ------------------------------------------------------------------------------------------
def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


CLI_CASES = {
    "pool file not UTF-8": (lambda d: ["run", "2+2", "--pool", write(d, "p.yaml", NOT_UTF8)], "can't read pool file"),
    "pool file missing": (lambda d: ["run", "2+2", "--pool", str(d / "none.yaml")], "can't read pool file"),
    "pool file a folder": (lambda d: ["pool", "--pool", str(d)], "can't read pool file"),
    "pool file a list": (lambda d: ["pool", "--pool", write(d, "p.yaml", "- 1")], "must hold a mapping"),
    "pool file bad TOML": (lambda d: ["pool", "--pool", write(d, "p.toml", "workers = [")], "is not valid TOML"),
    "pool --program missing": (lambda d: ["pool", "--program", str(d / "none")], "is not a folder"),
    "program a file": (lambda d: ["run", "2+2", "--program", write(d, "f", "x")], "is not a folder"),
    "question not UTF-8": (
        lambda d: ["run", os.fsdecode(b"caf\xe9 2+2"), "--pool", write(d, "p.yaml", POOL), "--conductor", "tiny"],
        "the question is not UTF-8 text: byte 0xE9 at character 3",
    ),
    "question with a lone surrogate": (
        lambda d: ["run", "x\ud800", "--pool", write(d, "p.yaml", POOL), "--conductor", "tiny"],
        "the question is not UTF-8 text: a lone surrogate U+D800",
    ),
    "conductor without an API key": (
        lambda d: ["run", "2+2", "--pool", write(d, "p.yaml", POOL), "--conductor", "openai/gpt-4o-mini"],
        "the conductor LM 'openai/gpt-4o-mini' failed: [openai/gpt-4o-mini] no API key found",
    ),
    "unknown local conductor": (
        lambda d: ["run", "2+2", "--pool", write(d, "p.yaml", POOL), "--conductor", "local/nope"],
        "unknown local model 'nope'",
    ),
    "budget NaN": (lambda d: ["run", "2+2", "--program", str(d), "--max-cost", "nan"], "invalid budget"),
    "budget negative": (lambda d: ["run", "2+2", "--program", str(d), "--max-tokens", "-5"], "invalid budget"),
    "temperature NaN": (lambda d: ["run", "2+2", "--conductor", "tiny", "--temperature", "nan"], "between 0 and 2"),
    "max steps 0": (lambda d: ["run", "2+2", "--conductor", "tiny", "--max-steps", "0"], "must be at least 1"),
    "conductor max tokens 0": (
        lambda d: ["run", "2+2", "--conductor", "tiny", "--conductor-max-tokens", "0"],
        "must be at least 1",
    ),
    "threads 0": (lambda d: ["run", "2+2", "--threads", "0"], "must be at least 1"),
    "threads a word": (lambda d: ["serve", "--threads", "many"], "'many' is not a whole number"),
    "saved program with fresh options": (
        lambda d: ["run", "2+2", "--program", str(d), "--free"],
        "--free shape(s) a fresh conductor",
    ),
    "keys file not UTF-8": (
        lambda d: ["keys", "add", "--id", "a", "--file", write(d, "k.yaml", NOT_UTF8)],
        "can't read the keys file",
    ),
    "keys file a number": (
        lambda d: ["keys", "add", "--id", "a", "--file", write(d, "k.yaml", "keys: 5")],
        "must hold a mapping with a `keys` list",
    ),
    "keys file a folder": (lambda d: ["keys", "add", "--id", "a", "--file", str(d)], "can't read the keys file"),
    "serve a missing program": (lambda d: ["serve", str(d / "none")], "is not a folder"),
    "config not UTF-8": (lambda d: ["compile", write(d, "c.yaml", b"data: \xff\n")], "can't read config"),
    "config a list": (lambda d: ["train", write(d, "c.yaml", "- 1")], "must hold a mapping"),
    "config bad YAML": (lambda d: ["compile", write(d, "c.yaml", "data: [")], "can't read config"),
    "config wrong types": (
        lambda d: ["compile", write(d, "c.yaml", "program: {max_steps: -1}\ndata: {loader: 1}\noutput_dir: [1]\n")],
        "program.max_steps: Input should be greater than or equal to 1",
    ),
    "config unknown field": (
        lambda d: ["compile", write(d, "c.yaml", RUN_CONFIG + "extra: 1\n")],
        "extra: Extra inputs are not permitted",
    ),
    "config loader missing": (
        lambda d: ["compile", write(d, "c.yaml", RUN_CONFIG.replace("conductor.bench.datasets", "nope_mod"))],
        "can't import 'nope_mod:load_gsm8k'",
    ),
    "config loader with wrong args": (
        lambda d: ["compile", write(d, "c.yaml", RUN_CONFIG.replace("load_gsm8k'", "load_gsm8k', args: {x: 1}"))],
        "failed: TypeError",
    ),
    "train without grpo": (lambda d: ["train", write(d, "c.yaml", RUN_CONFIG)], "has no `grpo` section"),
    "eval a missing program": (
        lambda d: ["eval", str(d / "none"), "--config", write(d, "c.yaml", RUN_CONFIG)],
        "is not a folder",
    ),
    "bench config not UTF-8": (lambda d: ["bench", write(d, "b.yaml", b"\xff")], "can't read experiment config"),
}


@pytest.mark.parametrize(("argv", "message"), CLI_CASES.values(), ids=CLI_CASES)
def test_bad_command_line_input_is_one_clear_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv(tmp_path))
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    assert_clean_error(code, capsys.readouterr().err, message)


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("  ", "the question is empty"),
        ("x" * 100_000, "the question is too long for the conductor: its prompt has"),
    ],
    ids=["empty", "100 KB"],
)
def test_a_question_the_run_refuses_is_one_clear_line(tmp_path, capsys, question, message):
    code = main(["run", question, "--pool", write(tmp_path, "p.yaml", POOL), "--conductor", "tiny", "--free"])
    out = capsys.readouterr().out
    assert_clean_error(code, out, message, expected_code=1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([os.fsencode("run"), b"caf\xe9?", b"--pool", b"{pool}", b"--conductor", b"tiny"], "byte 0xE9"),
        (["run", "2+2", "--program", "{corrupted}", "--trust-code"], "manifest.json can't be read"),
        (["run", "2+2", "--pool", "{pool}", "--conductor", "openai/gpt-4o-mini"], "no API key found"),
    ],
    ids=["non-UTF-8 bytes", "corrupted manifest", "conductor without a key"],
)
def test_the_installed_command_prints_no_traceback(saved, tmp_path, argv, message):
    pool = write(tmp_path, "p.yaml", POOL)
    folder = corrupted(saved, tmp_path, "manifest.json", lambda t: t[:10])
    fill = {"{pool}": pool, "{corrupted}": str(folder)}
    argv = [os.fsencode(fill.get(os.fsdecode(a), os.fsdecode(a))) for a in argv]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | {"COLUMNS": "200"}
    done = subprocess.run([CONDUCTOR, *argv], capture_output=True, env=env, timeout=300)
    err = done.stderr.decode(errors="replace")
    assert_clean_error(done.returncode, err, message)
    assert err.count("\n") <= 2, err  # the error, wrapped at most once; no library warnings


# ---- the library -----------------------------------------------------------------------------------------------
def calc_pool() -> WorkerPool:
    return WorkerPool.from_config({"workers": [{"name": "calc", "kind": "tool", "tool": "calculator"}]})


HUGE_ID = "model_id = [" + "7" * 4_301 + ']\nsubtasks = ["2+2"]\naccess_list = [[]]'


@pytest.mark.parametrize(
    ("inputs", "conductor_writes", "kind", "message"),
    [
        ({"question": "x\ud800y"}, "", "input", "lone surrogate (U+D800) at character 1"),
        ({"question": "\t"}, "", "input", "the question is empty"),
        ({"question": "x" * 300_000}, "", "input", "the limit is 200,000"),
        ({"query": "2+2"}, "", "input", "missing input field(s): ['question']"),
        ({"question": "2+2"}, HUGE_ID, "format", "model_id[0] is not a worker index: '7777"),
        ({"question": "2+2"}, 'model_id = ["' + "7" * 4_301 + '"]', "format", "missing list"),
        ({"question": "2+2"}, "model_id = [[[[" * 5_000, "format", "missing list"),
        ({"question": "2+2"}, "\ud800 model_id: [0]", "format", "missing list"),
    ],
    ids=["surrogate", "empty", "too long", "missing field", "4,301-digit id", "quoted id", "deep nesting", "junk"],
)
def test_the_library_answers_bad_input_with_a_run_error(inputs, conductor_writes, kind, message):
    prediction = Conductor(calc_pool(), scripted_lm([conductor_writes]))(**inputs)
    assert prediction.error.kind == kind and message in prediction.error.message
    if kind == "format":  # the fallback still answered
        assert prediction.answer == "4"


@pytest.mark.parametrize(
    "text",
    [
        HUGE_ID,
        HUGE_ID.replace("[" + "7" * 4_301 + "]", '["Model ' + "7" * 4_301 + '"]'),
        'model_id = [0]\nsubtasks = ["a"]\naccess_list = [[' + "1" * 4_301 + "]]",
        'model_id = [1e400]\nsubtasks = ["a"]\naccess_list = ["' + "2" * 5_000 + '"]',
        "model_id = " + "[" * 100_000,
        'model_id = [0]\nsubtasks = "a"\naccess_list = ' + "[]" * 50_000,
    ],
    ids=["4,301-digit id", "4,301-digit 'Model' id", "4,301-digit access", "overflowing float", "unclosed", "junk"],
)
def test_any_conductor_text_is_a_workflow_or_a_short_workflow_error(text):
    with pytest.raises(WorkflowError) as error:
        Workflow.parse(text)
    assert len(str(error.value)) < 300  # what the conductor wrote is shortened in the message


def test_a_question_beyond_the_conductor_context_is_refused_before_any_call(one_torch_thread):
    from conductor.deploy import conductor_lm

    lm = conductor_lm("tiny", max_tokens=8)
    prediction = Conductor(calc_pool(), lm)(question="word " * 20_000)
    assert prediction.error.kind == "input" and "takes at most 4,096" in prediction.error.message
    assert prediction.trace == [] and prediction.conductor_usage.tokens == 0 and not lm.history


def test_an_unreachable_conductor_lm_is_a_conductor_error():
    lm = dspy.LM("openai/gpt-4o-mini", api_base="http://127.0.0.1:9/v1", api_key="sk-none", num_retries=0)
    with pytest.raises(ConductorError, match=r"the conductor LM 'openai/gpt-4o-mini' failed: .*connect"):
        Conductor(calc_pool(), lm)(question="2+2")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([1], "Input should be a valid dictionary"),
        ({"workers": "x"}, "workers: Input should be a valid list"),
        ({"workers": []}, "at least 1 item"),
        ({"workers": [{"name": "a", "kind": "robot"}]}, "workers.0"),
        ({"workers": [{"name": "a", "kind": "lm"}]}, "needs `model`"),
        ({"workers": [{"name": "a", "kind": "tool", "tool": "nope_mod:f"}]}, "nope_mod"),
        ({"workers": [{"name": "a", "kind": "tool", "tool": "calculator", "max_tokens": -1}]}, "max_tokens"),
        ({"workers": [{"name": "a", "kind": "tool", "tool": "calculator", "timeout_s": math.nan}]}, "timeout_s"),
        ({"workers": [{"name": "a", "kind": "lm", "model": "m", "price": {"input_per_1k": -1}}]}, "input_per_1k"),
        ({"workers": [{"name": "a", "kind": "tool", "tool": "calculator"}] * 2}, "names must be unique"),
    ],
    ids=["list", "workers str", "no workers", "kind", "no model", "tool import", "tokens", "timeout", "price", "dup"],
)
def test_a_bad_pool_config_is_a_config_error(config, message):
    with pytest.raises(ConductorError, match=message):
        WorkerPool.from_config(config)


@pytest.mark.parametrize(
    "limits",
    [{"max_cost": math.nan}, {"max_cost": math.inf}, {"max_tokens": -1}, {"max_steps": -2}, {"max_tokens": "lots"}],
    ids=["nan cost", "infinite cost", "negative tokens", "negative steps", "word"],
)
def test_a_budget_that_is_no_limit_is_a_config_error(limits):
    with pytest.raises(ConductorError, match="budget"):
        Budget(**limits)


@pytest.mark.parametrize(
    "options",
    [
        {"max_steps": 0},
        {"max_depth": -1},
        {"fallback": "guess"},
        {"roles": ("solve",)},
        {"budget": "lots"},
        {"max_question_chars": 0},
        {"max_parallel": 0},
    ],
    ids=["max_steps", "max_depth", "fallback", "roles", "budget", "max_question_chars", "max_parallel"],
)
def test_bad_conductor_options_are_a_config_error(options):
    with pytest.raises(ConductorError):
        Conductor(calc_pool(), scripted_lm([]), **options)


@pytest.mark.parametrize("path", ["missing", "file"], ids=["missing folder", "a file"])
def test_loading_what_is_no_program_is_a_conductor_error(tmp_path, path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConductorError, match="is not a folder"):
        conductor.load(tmp_path / path)
