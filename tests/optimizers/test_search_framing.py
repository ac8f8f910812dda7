"""Program search finds, per question, whether a model answers it better asked the question alone (as a user would
ask it) or through the library's task prompt: the plain form is a subtask (``QUESTION_ALONE``) the conductor writes
per step, so one model can be asked plain on one kind of question and task-framed on another, in the same pool."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from conductor.modules import Conductor, WorkerPool
from conductor.modules.programs import QUESTION_ALONE
from conductor.optimizers import ConductorCompiler, ProgramSearchConfig, program_search, write_search_report
from conductor.testing import ScriptedWorker
from tests.modules.framing import ANSWERS, MIXED_POOL, config_models, examples, question_in, right

CONFIG = ProgramSearchConfig(samples=0, pairs=False, propose=False)
CAPITALS = {"What is the capital of France?", "What is the capital of Japan?"}


def two_minded(prompt: str) -> str:
    """Answers a capital only when asked the question alone, anything else only through the task prompt."""
    question = question_in(prompt)
    answers = {**ANSWERS, "What is the capital of Japan?": "Tokyo"}
    asked_alone = prompt == question
    return answers.get(question, "?") if asked_alone == (question in CAPITALS) else "Your subtask is correct."


def kinds() -> list[dspy.Example]:
    return [*examples(), dspy.Example(question="What is the capital of Japan?", answer="Tokyo").with_inputs("question")]


def test_the_search_teaches_one_model_asked_plain_on_one_kind_and_task_framed_on_another(tmp_path: Path) -> None:
    model = ScriptedWorker("m", two_minded)
    program = Conductor(WorkerPool([model]), max_steps=1)
    result = program_search(program, kinds(), right, CONFIG.model_copy(update={"neighbours": 1}))
    assert [c.name for c in result.candidates] == ["m", "m (plain)"]
    taught = {ex.question: result.winner(i).name for i, ex in enumerate(result.examples)}
    assert taught == {q: "m (plain)" if q in CAPITALS else "m" for q in taught}, taught
    assert [{"role": "user", "content": "What is the capital of Japan?"}] in model.messages  # asked alone
    write_search_report(result, tmp_path)
    space = json.loads((tmp_path / "candidates.json").read_text())
    assert space[1] == {"name": "m (plain)", "steps": [{"worker": "m", "subtask": QUESTION_ALONE, "access": []}]}


def test_without_plain_candidates_the_space_has_only_task_prompts() -> None:
    program = Conductor(WorkerPool([ScriptedWorker("m", two_minded)]), max_steps=1)
    result = program_search(program, kinds(), right, CONFIG.model_copy(update={"plain": False}))
    assert [c.name for c in result.candidates] == ["m"]


def test_a_compiled_program_keeps_its_pool_and_asks_plain_through_the_subtask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    assert [w.framing for w in searched.pool] == ["task", "task", "task"]  # the framing is the step's, not the pool's
    oracle = json.loads((tmp_path / "search" / "oracle.json").read_text())
    assert oracle[0]["best_single"] == "chat (plain)"  # the plainspoken model is right only asked alone
    assert not (tmp_path / "search" / "framings.json").exists()
