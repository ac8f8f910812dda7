"""Every script in examples/ runs as a user would run it (its own process, from the repository root), and prints or
writes what its docstring promises: a broken example fails here.

Where an example talks to a server, the test starts one on a free localhost port: the package's own app over a
scripted program for workers, and a stand-in conductor LM that always writes the same workflow. The compile example
runs with its smallest settings (the built-in tools, a tiny random-weight conductor, 2 warm-start steps): about a
minute, most of it loading torch and scoring under the grammar.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.examples.helpers import ROOT, fixed_program, run_example, served, stand_in_conductor

TOOLS_POOL = "examples/data/tools_pool.yaml"


@pytest.mark.slow  # the shipped trained conductor: SmolLM2-135M with its LoRA adapter
def test_local_pool_answers_with_the_trained_conductor_and_prints_the_trace() -> None:
    out = run_example("local_pool.py", "What is 17 * 23 + 4?", timeout_s=600)
    assert "Pool: smollm2, gemma, python, calculator" in out
    assert 'model_id = ["calculator"]' in out  # the trained conductor sends arithmetic to the calculator
    assert "step 0 · calculator · solve" in out and "$0.000000" in out
    assert "Answer: 395" in out
    assert "the conductor's) · $0.000000" in out


def test_compile_own_data_searches_trains_and_saves_a_program(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    pytest.importorskip("xgrammar")
    run, saved = tmp_path / "run", tmp_path / "program"
    args = ["examples/data/questions.jsonl", "--pool", TOOLS_POOL, "--conductor", "tiny", "--steps", "2"]
    out = run_example("compile_own_data.py", *args, "--output", str(run), "--save", str(saved), timeout_s=600)
    assert "16 questions: 8 to train, 4 to validate, 4 to test" in out
    oracle = (run / "search" / "oracle.md").read_text()
    for tool in ("calculator", "python"):  # each tool's workflow is the best on the questions it answers
        assert re.search(rf"\| {tool}[^|]* \| \d+ \| {tool}[^|]* \| 1\.00 \|", oracle), oracle
    assert "| program-search |" in (run / "phases.md").read_text()
    assert [w["name"] for w in json.loads((saved / "pool.json").read_text())["workers"]] == ["calculator", "python"]
    assert (saved / "conductor_lm").is_dir()  # the trainable conductor is saved with its adapter
    assert f"Saved the compiled program to {saved}; it scores" in out


def test_openai_compatible_pool_runs_the_workflow_on_the_endpoints() -> None:
    pytest.importorskip("fastapi")
    workflow = 'model_id = [0, 1]\nsubtasks = ["Answer.", "Check the answer, then give it."]\naccess_list = [[], "all"]'
    team = fixed_program("212 degrees Fahrenheit")
    with stand_in_conductor(workflow) as planner, served(team, "team") as team_url:
        out = run_example(
            "openai_compatible_pool.py",
            "What is the boiling point of water in Fahrenheit?",
            *("--api-base", team_url, "--worker", "small=openai/team", "--worker", "large=openai/team"),
            *("--conductor", "openai/planner", "--conductor-api-base", planner.api_base),
            env={"OPENAI_API_KEY": "none"},
        )
    assert planner.requests == 1 and team.pool[0].calls == 2  # one workflow; each of its steps one request
    assert 'model_id = ["small", "large"]' in out
    assert "step 0 · small ·" in out and "step 1 · large ·" in out
    assert "Answer: 212 degrees Fahrenheit" in out
    assert "$0.000000" in out  # the endpoints are priced at $0


def test_deploy_and_call_saves_serves_and_answers_plainly_and_streaming(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    folder = tmp_path / "my-conductor"
    with stand_in_conductor('model_id = [0]\nsubtasks = ["17 * 23 + 4"]\naccess_list = [[]]') as planner:
        out = run_example(
            "deploy_and_call.py",
            "What is 17 * 23 + 4?",
            *("--conductor", "openai/planner", "--pool", TOOLS_POOL, "--folder", str(folder)),
            env={"OPENAI_API_KEY": "none", "OPENAI_BASE_URL": planner.api_base},  # how litellm finds the stand-in
        )
    assert (folder / "manifest.json").is_file()
    assert f"Saved the program to {folder}" in out and "Serving my-conductor at http://127.0.0.1:" in out
    assert "Answer: 395" in out and "Streamed answer: 395" in out
    assert 'subtasks = ["17 * 23 + 4"]' in out  # the run's workflow, from the response's `conductor` field
    assert planner.requests == 2  # the served program's conductor wrote a workflow for each call


def test_custom_workers_runs_a_function_a_dspy_tool_and_a_custom_role() -> None:
    out = run_example("custom_workers.py")
    assert "step 0: count_words (solve) <- 'the quick brown fox jumps over the lazy dog'\n    -> 9" in out
    assert "step 1: convert (solve)" in out and "-> 42.16 km" in out  # the JSON subtask became both arguments
    assert "step 2: writer (report)" in out
    assert "Answer: Report: 9; 42.16 km" in out


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on the machine (pyproject's addopts)
def test_eval_on_ray_scores_every_method_on_a_local_cluster(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = run_example("eval_on_ray.py", "--pool", TOOLS_POOL, "--output", str(tmp_path), timeout_s=600)
    assert "Scored on a Ray cluster of" in out
    # the calculator answers the 6 sums of the 16 questions, the Python tool the 4 programs
    assert "| only calculator | 16 | 37.5 [" in out and "| only python | 16 | 25.0 [" in out
    assert "| random workflow | 16 |" in out
    records = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(records) == 3 * 16
    assert (tmp_path / "table.md").is_file() and (tmp_path / "plot.png").is_file()


def test_every_example_is_listed_in_the_examples_readme() -> None:
    readme = (ROOT / "examples" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
    assert len(scripts) == 6
    assert [s for s in scripts if f"python examples/{s}" not in readme] == []
