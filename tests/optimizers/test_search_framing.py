"""Program search tunes each model's framing: it scores every model alone asked the question as a user would (the
plain framing), and each pair it opens so, beside their task-framed twins, and the compiled pool keeps, per model, the
framing its workflows scored higher in on the training questions ("task" on a tie)."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from conductor.modules import Conductor, WorkerPool
from conductor.modules.programs import DIRECT_SUBTASK as DIRECT
from conductor.optimizers import ConductorCompiler, ProgramSearchConfig, program_search, write_search_report
from conductor.optimizers.finetune import TemplateStep
from conductor.optimizers.search import Candidate, Outcome, SearchCost, SearchResult
from conductor.testing import ScriptedWorker
from tests.modules.framing import MIXED_POOL, config_models, examples, formal, plainspoken, right, steady

CONFIG = ProgramSearchConfig(samples=0, pairs=False, propose=False)


def test_the_search_keeps_for_each_model_the_framing_it_answers_better_in(tmp_path: Path) -> None:
    models = [ScriptedWorker("chat", plainspoken), ScriptedWorker("formal", formal), ScriptedWorker("steady", steady)]
    program = Conductor(WorkerPool(models), max_steps=1)
    result = program_search(program, examples(), right, CONFIG)
    choices = {choice.worker: choice for choice in result.framings()}
    assert {name: choice.framing for name, choice in choices.items()} == {
        "chat": "plain",
        "formal": "task",
        "steady": "task",  # a tie keeps the library's prompt
    }
    assert (choices["chat"].plain_score, choices["chat"].task_score, choices["chat"].questions) == (1.0, 0.0, 4)
    assert all([{"role": "user", "content": ex.question}] in models[0].messages for ex in examples())  # alone
    # what the warm start may teach is each step in the framing its model keeps
    assert {c.name for c in result.taught} == {"chat (plain)", "formal", "steady"}
    assert result.winner(0).name in {"chat (plain)", "formal", "steady"}
    write_search_report(result, tmp_path)
    saved = {row["worker"]: row["framing"] for row in json.loads((tmp_path / "framings.json").read_text())}
    assert saved == {"chat": "plain", "formal": "task", "steady": "task"}
    assert "chat plain (1.00 plain, 0.00 task on 4 questions)" in (tmp_path / "oracle.md").read_text()


def test_a_model_keeps_the_framing_its_workflows_answer_better_in_not_only_its_single_step() -> None:
    # "m" asked plain answers kind A (3 questions) alone; in the task framing its answer, recomputed by tool "t",
    # answers kind B (5 questions), which its plain answer can't. The pool's framing changes both workflows, so "m"
    # keeps the task framing, though its single step alone scored higher plain.
    first, check = TemplateStep(worker="m", subtask=DIRECT, access=()), TemplateStep(worker="t", subtask="check")
    shapes = {"m": "task", "m (plain)": "plain", "m -> t": "task", "m (plain) -> t": "plain"}
    candidates = [Candidate(n, (first, check) if "->" in n else (first,), framing) for n, framing in shapes.items()]
    right_on = {"a": {"m (plain)"}, "b": {"m -> t"}}
    kinds = ["a"] * 3 + ["b"] * 5
    rows = [{n: Outcome(float(n in right_on[kind]), 1 + ("->" in n), 10, 0.0) for n in shapes} for kind in kinds]
    questions = [dspy.Example(question=f"{kind} {i}").with_inputs("question") for i, kind in enumerate(kinds)]
    result = SearchResult(candidates, questions, rows, SearchCost())
    (choice,) = result.framings()
    assert (choice.worker, choice.framing, choice.task_score, choice.plain_score) == ("m", "task", 5 / 8, 3 / 8)
    assert [c.name for c in result.taught] == ["m", "m -> t"]


def test_without_plain_candidates_no_framing_is_chosen() -> None:
    program = Conductor(WorkerPool([ScriptedWorker("chat", plainspoken)]), max_steps=1)
    result = program_search(program, examples(), right, CONFIG.model_copy(update={"plain": False}))
    assert result.framings() == [] and [c.name for c in result.candidates] == ["chat"]


def test_a_compiled_pool_keeps_each_model_s_better_framing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from conductor.conductor_lm import ConductorLM
    from conductor.deploy import load_program

    config_models(monkeypatch)
    pool = WorkerPool.from_config(MIXED_POOL)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = ConductorLM.tiny(seed=0)
    program = Conductor(pool, policy.as_dspy_lm(max_tokens=8), fallback="first_worker")
    search = {**CONFIG.model_dump(), "pools_per_question": 1, "training": {"steps": 1, "max_length": 4096}}
    ConductorCompiler(right, output_dir=tmp_path, search=search).compile(program, trainset=examples())
    searched = load_program(tmp_path / "phases" / "1-program-search", trust_code=True)
    assert [w.framing for w in searched.pool] == ["plain", "task", "task"]
    assert [w.framing for w in pool] == ["task", "task", "task"]  # the student's own pool is left as it was
    (row,) = [r for r in json.loads((tmp_path / "phases.json").read_text()) if r["phase"] == "program-search"]
    assert "the workers' framing: chat plain (1.00 plain, 0.00 task on 4 questions), formal task" in row["change"]
