"""``conductor train``, ``eval`` and ``compile`` end to end on the tiny random policy over a tool-only pool, and the
config's errors reported all at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dspy
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.cli import load_run_config, main  # noqa: E402
from conductor.errors import ConfigError  # noqa: E402
from conductor.modules import ReplayStore  # noqa: E402

POOL = {
    "workers": [
        {"name": "calc", "kind": "tool", "tool": "calculator"},
        {"name": "title", "kind": "tool", "tool": "string:capwords"},
    ]
}


def load_items(n: int = 6) -> list[dspy.Example]:
    """The test's data loader, named in configs as ``tests.cli.test_train_compile:load_items``: two families."""
    return [
        dspy.Example(question=f"{i} + {i}", answer=str(2 * i), family="odd" if i % 2 else "even").with_inputs(
            "question"
        )
        for i in range(n)
    ]


def right(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    return float(str(prediction.answer).strip() == example.answer)


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs with one torch thread (see tests/conftest.py)."""


def write_config(tmp_path: Path, program: dict[str, Any] | None = None, **sections: Any) -> Path:
    """A tiny run: the random policy, 6 questions split 4/1/1, short workflows; ``program`` overrides."""
    program = program or {}
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump(POOL))
    config = {
        "program": {"pool": str(pool), "conductor": "tiny", "max_steps": 2, "max_tokens": 24} | program,
        "data": {
            "loader": "tests.cli.test_train_compile:load_items",
            "metric": "tests.cli.test_train_compile:right",
            "fractions": [4 / 6, 1 / 6, 1 / 6],
        },
        "output_dir": str(tmp_path / "run"),
        **sections,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


GRPO = {"steps": 2, "batch_size": 1, "group_size": 2, "max_new_tokens": 16, "progress": False, "warmup_ratio": 0.0}


def test_every_config_error_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "program": {"max_steps": 0, "lora": {"r": 0}, "conductor": "smollm2-135m-instruct"},
                "data": {"loader": "no colon", "metric": "m:f", "fractions": [0.9, 0.9, 0]},
                "grpo": {"group_size": 1},
                "compile": {"rounds": 0},
                "surprise": 1,
            }
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_run_config(path)
    message = str(caught.value)
    for where in (
        "program.max_steps",
        "program.conductor: an embedded local model is named local/smollm2-135m-instruct",
        "program.lora.r",
        "data.loader",
        "data.fractions",
        "grpo.group_size",
        "compile.rounds",
        "output_dir",
        "surprise",
    ):
        assert where in message, (where, message)
    assert "grpo.output_dir" not in message  # the missing output_dir is reported once


def assert_ends_with_scores_and_workflows(out: str, before: str, after: str) -> None:
    """The held-out table (validation and test accuracy, before and after) and the learned workflows' table."""
    assert "| program | validation accuracy | test accuracy | n |" in out, out
    assert f"| {before} |" in out and f"| {after} |" in out
    workflows = out[out.index("| method | kind |") :]
    assert f"| {after} | even |" in workflows or f"| {after} | odd |" in workflows, workflows
    assert "calc[]" in workflows or "title[]" in workflows  # a workflow as its steps' workers


def test_train_writes_metrics_and_a_program_that_eval_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    grammar = {"grammar": True, "max_steps": 1, "max_tokens": 64}  # the tiny policy is valid only when constrained
    config = write_config(tmp_path, grammar, grpo={**GRPO, "max_new_tokens": 64, "progress": True})
    assert main(["train", str(config)]) == 0
    shown = capsys.readouterr()
    assert "GRPO" in shown.err and "2/2" in shown.err  # GRPO's bar, then a bar per split scored, without -v
    assert shown.err.count("questions answered") == 4, shown.err  # untrained and trained, validation and test
    assert_ends_with_scores_and_workflows(shown.out, "untrained", "trained")
    run = tmp_path / "run"
    held_out = json.loads((run / "held_out.json").read_text())
    assert set(held_out) == {"untrained", "trained"}
    assert all(0 <= r["validation_accuracy"] <= 1 for r in held_out.values())
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and steps[-1]["format_failure_rate"] == 0.0  # the grammar was on
    manifest = json.loads((run / "program" / "manifest.json").read_text())
    assert manifest["conductor_lm"]["workflow_grammar"] is True
    assert main(["train", str(config), "--resume", "--no-test"]) == 0  # every step is done: nothing to run again
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert "questions answered" not in capsys.readouterr().err

    answers = tmp_path / "answers.jsonl"
    evaluate = ["eval", str(run / "program"), "--trust-code", "--config", str(config), "--split", "train"]
    assert main([*evaluate, "--json", "--answers", str(answers)]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [row["question"] for row in rows] == [e.question for e in load_run_config(config).splits().train]
    assert len(rows) == 4 and {"answer", "expected", "score", "workflow", "tokens", "cost", "family"} <= set(rows[0])
    assert all(row["workflow"].startswith("model_id = [") and row["tokens"] > 0 for row in rows), rows
    assert result["accuracy"] == pytest.approx(sum(row["score"] for row in rows) / 4)
    assert result["n"] == 4 and 0.0 <= result["accuracy"] <= 1.0
    by_family = result["by_family"]
    assert sum(f["n"] for f in by_family.values()) == 4 and set(by_family) <= {"odd", "even"}
    assert result["accuracy"] == pytest.approx(sum(f["accuracy"] * f["n"] for f in by_family.values()) / 4)
    assert result["format_error_rate"] == 0.0 and result["tokens_per_question"] >= 0  # loaded under its grammar

    assert main(["eval", str(run / "program"), "--trust-code", "--config", str(config)]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_compile_runs_few_shot_and_grpo_and_prints_the_phase_table(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = write_config(tmp_path, grpo={**GRPO, "steps": 1}, compile={"few_shot": 1, "candidates": 0})
    assert main(["compile", str(config)]) == 0
    table = (tmp_path / "run" / "phases.md").read_text()
    assert [row.split("|")[1].strip() for row in table.splitlines()[2:]] == ["start", "prompt-1", "grpo-1"]
    shown = capsys.readouterr()
    assert "| start |" in shown.out
    assert_ends_with_scores_and_workflows(shown.out, "uncompiled", "compiled")
    assert "questions answered" in shown.err and "1/1" in shown.err  # each phase's scoring had its bar, without -v
    assert (tmp_path / "run" / "best" / "manifest.json").exists()
    held_out = json.loads((tmp_path / "run" / "held_out.json").read_text())
    assert set(held_out) == {"uncompiled", "compiled"} and all(r["n"] == 1 for r in held_out.values())
    phases = json.loads((tmp_path / "run" / "phases.json").read_text())
    assert held_out["uncompiled"]["validation_accuracy"] == phases[0]["score"] / 100  # the start, as the phases scored
    saved = sorted(path.name for path in (tmp_path / "run" / "phases").iterdir())
    assert saved == ["0-start", "1-prompt-1", "2-grpo-1"]
    # every phase against the program it started from, on the validation and the test question alike
    paired = json.loads((tmp_path / "run" / "paired.json").read_text())
    started_from = "prompt-1" if phases[1]["kept"] else "start"
    for split in ("validation", "test"):
        assert [(row["b"], row["a"], row["n"]) for row in paired[split]] == [
            ("prompt-1", "start", 1),
            ("grpo-1", started_from, 1),
        ]
    assert "## validation" in shown.out and "## test" in shown.out and "| grpo-1 | " in shown.out


def test_the_reward_flags_set_grpo_s_penalties(tmp_path: Path) -> None:
    grammar = {"grammar": True, "max_steps": 1, "max_tokens": 64}  # valid workflows: steps that pay the penalty
    grpo = {**GRPO, "steps": 1, "max_new_tokens": 64, "reward": {"step_penalty": 0.1}}
    config = write_config(tmp_path, grammar, grpo=grpo, compile={"few_shot": 0})
    flags = ["--reward-steps", "0.25", "--reward-tokens", "0.5", "--reward-cost", "2"]
    assert main(["compile", str(config), "--no-test", *flags]) == 0
    rollouts = [json.loads(line)["reward"] for line in (tmp_path / "run" / "grpo-1" / "rollouts.jsonl").open()]
    ran = [r for r in rollouts if r["format_ok"]]
    assert ran, rollouts
    for r in ran:  # the flags' weights, not the config's 0.1 a step
        assert r["penalty"] == pytest.approx(0.25 * r["steps"] + 0.5 * r["tokens"] / 1000 + 2 * r["cost"])
        assert r["penalty"] > 0


def test_reward_flags_without_a_grpo_section_fail_clearly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path, compile={"few_shot": 1})
    assert main(["compile", str(config), "--reward-cost", "1"]) == 2
    assert "GRPO's reward weights were given (--reward-cost), but" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: a weight is 0 or more
        main(["compile", str(config), "--reward-steps", "-1"])


def test_compile_without_few_shot_runs_no_prompt_phase(tmp_path: Path) -> None:
    config = write_config(tmp_path, grpo={**GRPO, "steps": 1}, compile={"few_shot": 0})
    assert main(["compile", str(config), "--no-test"]) == 0
    phases = [r["phase"] for r in json.loads((tmp_path / "run" / "phases.json").read_text())]
    assert phases == ["start", "grpo-1"] and not (tmp_path / "run" / "held_out.json").exists()


def test_compile_runs_expert_iteration_before_grpo(tmp_path: Path) -> None:
    grammar = {"grammar": True, "max_steps": 1, "max_tokens": 64}  # valid workflows, some on the calculator
    expert = {"samples": 8, "balance_by": "family", "per_label": 2, "max_new_tokens": 64}
    expert["warm_start"] = {"steps": 2, "max_length": 4096}  # the byte-level tiny policy: a token a byte
    config = write_config(
        tmp_path,
        grammar,
        grpo={**GRPO, "steps": 1, "max_new_tokens": 64},
        expert_iteration=expert,
        compile={"few_shot": 0},
    )
    assert main(["compile", str(config), "--no-test"]) == 0
    records = json.loads((tmp_path / "run" / "phases.json").read_text())
    assert [r["phase"] for r in records] == ["start", "expert-iteration", "grpo-1"]
    change = records[1]["change"]
    assert "expert iteration, 8 workflows sampled a question, those that earned 1.0 kept (" in change
    assert "even " in change and "odd " in change
    assert "2 warm-start steps" in change
    assert (tmp_path / "run" / "warm_start" / "expert-iteration.json").is_file()


def test_compile_runs_a_template_warm_start_first(tmp_path: Path) -> None:
    templates = {
        "even": [{"worker": "calc", "subtask": "Add.", "access": []}],
        "odd": [{"worker": "title", "subtask": "Hm.", "access": []}, {"worker": "calc", "subtask": "Add."}],
    }
    warm = {"templates": templates, "pools_per_question": 2, "training": {"steps": 2, "max_length": 4096}}
    config = write_config(tmp_path, template_warm_start=warm, grpo={**GRPO, "steps": 1}, compile={"few_shot": 0})
    assert main(["compile", str(config), "--no-test"]) == 0
    records = json.loads((tmp_path / "run" / "phases.json").read_text())
    assert [r["phase"] for r in records] == ["start", "template-warm-start", "grpo-1"]
    change = records[1]["change"]
    assert "a warm start on 8 templated workflows (even, odd; 2 random pools a question), 2 steps (1.00 " in change
    assert (tmp_path / "run" / "warm_start" / "template-warm-start.json").is_file()


def test_a_template_naming_a_worker_outside_the_pool_fails_the_compile_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    warm = {"templates": {"even": [{"worker": "gpt-9", "subtask": "Add."}]}}
    config = write_config(tmp_path, template_warm_start=warm, grpo={**GRPO, "steps": 1}, compile={"few_shot": 0})
    assert main(["compile", str(config), "--no-test"]) == 2
    assert "no worker named 'gpt-9'" in capsys.readouterr().err
    assert not (tmp_path / "run" / "phases.json").exists()  # refused before the start was scored


def test_expert_iteration_and_grpo_must_sample_workflows_of_one_length(tmp_path: Path) -> None:
    expert = {"max_new_tokens": 32}
    config = write_config(tmp_path, grpo={**GRPO, "max_new_tokens": 64}, expert_iteration=expert)
    with pytest.raises(ConfigError, match=r"expert_iteration.max_new_tokens \(32\) and grpo.max_new_tokens \(64\)"):
        load_run_config(config)


def test_train_without_a_grpo_section_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", str(write_config(tmp_path))]) == 2
    assert "no `grpo` section" in capsys.readouterr().err


def test_a_config_can_have_workflows_name_the_workers(tmp_path: Path) -> None:
    config = load_run_config(write_config(tmp_path, {"worker_ids": "names", "max_tokens": 96, "grammar": True}))
    program = config.conductor(config.policy())
    assert program.worker_ids == "names"
    assert program.orchestrate.lm.engine.logits_processor.format.worker_names == ("calc", "title")
    with pytest.raises(ConfigError, match=r"program\.worker_ids"):
        load_run_config(write_config(tmp_path, {"worker_ids": "places"}))


def test_two_compiles_naming_one_replay_store_score_on_the_same_worker_samples(tmp_path: Path) -> None:
    """The second compile's validation sends its replay workers no prompt the first one sent; without the store
    each compile's process samples its own."""
    pool = {"workers": [{**worker, "replay": True} for worker in POOL["workers"]]}
    program = {"grammar": True, "max_steps": 1, "max_tokens": 64, "replay_store": "replay.sqlite"}
    config = write_config(tmp_path, program, compile={"few_shot": 1, "candidates": 0})
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    loaded = load_run_config(config)
    assert loaded.program.replay_store == tmp_path / "replay.sqlite"  # relative to the config
    assert all(worker.store.path == tmp_path / "replay.sqlite" for worker in loaded.pool())
    store = ReplayStore(tmp_path / "replay.sqlite")

    assert main(["compile", str(config), "--no-test"]) == 0
    asked = len(store)
    assert asked > 0  # the start's validation called its workers, through the store
    again = yaml.safe_load(config.read_text()) | {"output_dir": str(tmp_path / "again")}
    config.write_text(yaml.safe_dump(again))
    assert main(["compile", str(config), "--no-test"]) == 0
    assert len(store) == asked
    scores = [json.loads((tmp_path / run / "phases.json").read_text())[0]["score"] for run in ("run", "again")]
    assert scores[0] == scores[1]


def test_a_resumed_compile_scores_its_phases_left_on_the_configs_replay_store(tmp_path: Path) -> None:
    """The resumed program is loaded from `best/`, which names no store: the compile attaches the config's, so a
    phase run after the resume calls its workers through it (without that, it sampled its own and the store stayed
    empty)."""
    pool = {"workers": [{**worker, "replay": True} for worker in POOL["workers"]]}
    program = {"grammar": True, "max_steps": 1, "max_tokens": 64}
    config = write_config(tmp_path, program, compile={"few_shot": 1, "candidates": 0})
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    assert main(["compile", str(config), "--no-test"]) == 0
    state_path = tmp_path / "run" / "compiler_state.json"
    state = json.loads(state_path.read_text())
    assert state["done"] == ["prompt-1"]
    # as if the run had stopped after its start: the prompt phase is left to run, on the store named now
    start = state["validation_scores"]["start"]
    state.update(done=[], records=state["records"][:1], validation_scores={"start": start})
    state_path.write_text(json.dumps(state))
    named = yaml.safe_load(config.read_text())
    named["program"]["replay_store"] = "replay.sqlite"
    config.write_text(yaml.safe_dump(named))
    store = ReplayStore(tmp_path / "replay.sqlite")

    assert main(["compile", str(config), "--no-test"]) == 0
    assert json.loads(state_path.read_text())["done"] == ["prompt-1"]
    assert len(store) > 0


def test_eval_with_a_config_naming_a_replay_store_keeps_its_worker_samples_there(tmp_path: Path) -> None:
    """A saved program names no store; `conductor eval --config` attaches the config's, so its scores pair with the
    compile's (without it the store stays empty)."""
    pool = {"workers": [{**worker, "replay": True} for worker in POOL["workers"]]}
    config = write_config(
        tmp_path, {"grammar": True, "max_steps": 1, "max_tokens": 64}, compile={"few_shot": 1, "candidates": 0}
    )
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    assert main(["compile", str(config), "--no-test"]) == 0
    named = yaml.safe_load(config.read_text())
    named["program"]["replay_store"] = "replay.sqlite"
    config.write_text(yaml.safe_dump(named))
    store = ReplayStore(tmp_path / "replay.sqlite")
    assert len(store) == 0
    assert (
        main(["eval", str(tmp_path / "run" / "best"), "--config", str(config), "--split", "val", "--trust-code"]) == 0
    )
    assert len(store) > 0


def test_a_replay_store_needs_a_pool_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"pool": "default", "replay_store": "replay.sqlite"})
    with pytest.raises(ConfigError, match=r"program: .*replay_store needs a pool file"):
        load_run_config(config)


def write_questions(tmp_path: Path) -> Path:
    """A user's own file with nothing but questions and answers: sums the calculator answers, programs the Python
    tool answers, no label of which is which."""
    rows = [{"question": f"{i} + {i + 2}", "answer": str(2 * i + 2)} for i in range(4)]
    code = "What does this print?\n```python\nprint('ab' * {})\n```"
    rows += [{"question": code.format(i + 1), "answer": "ab" * (i + 1)} for i in range(4)]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def search_config(tmp_path: Path, **sections: Any) -> Path:
    path = write_config(tmp_path, **sections)
    config = yaml.safe_load(path.read_text())
    pool = {
        "workers": [
            {"name": "calc", "kind": "tool", "tool": "calculator"},
            {"name": "py", "kind": "tool", "tool": "python"},
        ]
    }
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    config["data"] = {"file": {"path": str(write_questions(tmp_path))}, "fractions": [0.75, 0.25, 0.0]}
    path.write_text(yaml.safe_dump(config))
    return path


SEARCH = {"samples": 0, "pools_per_question": 1, "training": {"steps": 2, "max_length": 4096}}


def test_compile_searches_a_file_of_questions_and_answers_and_teaches_the_winners(tmp_path: Path) -> None:
    config = search_config(tmp_path, search=SEARCH, compile={"few_shot": 0})
    assert main(["compile", str(config), "--no-test"]) == 0
    records = json.loads((tmp_path / "run" / "phases.json").read_text())
    assert [r["phase"] for r in records] == ["start", "program-search"]
    assert "a warm start on the search's winners" in records[1]["change"]
    assert "6 examples over random pools, 2 steps (1.00 epochs, loss " in records[1]["change"]  # 4, then the 2 left
    curve = json.loads((tmp_path / "run" / "warm_start" / "program-search.json").read_text())
    assert len(curve["losses"]) == len(curve["learning_rates"]) == 2
    assert curve["examples"] == curve["trained_examples"] == 6 and curve["epochs"] == 1.0
    found = {row["kind"]: row for row in json.loads((tmp_path / "run" / "search" / "oracle.json").read_text())}
    assert set(found) == {"calc", "py"}, found  # grouped by winner: each kind's own tool
    assert found["calc"]["best_score"] == found["py"]["best_score"] == 1.0
    summary = json.loads((tmp_path / "run" / "search" / "search.json").read_text())
    assert summary["candidates"] == 4 and summary["worker_calls"] > 0  # 2 singles and 2 pairs (no self-checks)


def test_search_alone_prints_the_oracle_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = search_config(tmp_path, search=SEARCH)
    assert main(["search", str(config)]) == 0
    out = capsys.readouterr().out
    assert "| kind | questions | best candidate |" in out and "| calc |" in out and "| py |" in out
    assert (tmp_path / "run" / "search" / "questions.jsonl").exists()
    with pytest.raises(SystemExit):  # argparse: at least 1
        main(["search", str(config), "--max-worker-calls", "0"])
