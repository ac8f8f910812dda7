import itertools
import json
import logging
import shutil
from typing import Any

import dspy
import pytest
from dspy.teleprompt import Teleprompter

from conductor import Conductor, ConductorError, WorkerPool
from conductor.deploy import load_program
from conductor.optimizers._compiler import ConductorCompiler, warn_if_small
from conductor.optimizers._paired import paired_difference_interval
from conductor.testing import ScriptedEngine

POOL = {
    "workers": [
        {"name": "title", "kind": "tool", "tool": "string:capwords"},
        {"name": "calc", "kind": "tool", "tool": "calculator"},
    ]
}
HINT = "Use the calculator for arithmetic."
GOOD = 'model_id = [1]\nsubtasks = ["17 * 23 + 4"]\naccess_list = [[]]'
BAD = 'model_id = [0]\nsubtasks = ["say something"]\naccess_list = [[]]'


class HintEngine(ScriptedEngine):
    """Writes the right workflow only when the hint is in the conductor's prompt; saveable with its LM."""

    def __init__(self):
        super().__init__(lambda prompt: GOOD if HINT in prompt else BAD)

    def dump_state(self) -> dict[str, Any]:
        return {}

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> "HintEngine":
        return cls()


def student() -> Conductor:
    lm = dspy.LM("scripted/hint", engine=HintEngine(), cache=False, num_retries=0)
    return Conductor(WorkerPool.from_config(POOL), lm)


def metric(example, prediction, trace=None):
    return prediction.answer == example.answer


EXAMPLES = [
    dspy.Example(question=f"What is 17 * 23 + 4? ({i})", answer="395").with_inputs("question") for i in range(3)
]


class SetInstructions(Teleprompter):
    """A stand-in prompt search: sets the conductor's instructions (and counts how often it ran)."""

    def __init__(self, text: str, fail_on_call: int | None = None):
        self.text, self.calls, self.fail_on_call = text, 0, fail_on_call

    def compile(self, student, *, trainset, valset=None):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt("stopped mid-compile")
        student.orchestrate.signature = student.orchestrate.signature.with_instructions(self.text)
        return student


def test_a_phase_that_helps_is_kept_and_the_phase_table_is_written(tmp_path):
    compiled = ConductorCompiler(metric, output_dir=tmp_path, prompt_search=SetInstructions(HINT)).compile(
        student(), trainset=EXAMPLES, valset=EXAMPLES
    )
    assert compiled.orchestrate.signature.instructions == HINT
    assert compiled(question="What is 17 * 23 + 4?").answer == "395"
    rows = json.loads((tmp_path / "phases.json").read_text())
    assert [(r["phase"], r["score"], r["kept"]) for r in rows] == [("start", 0.0, True), ("prompt-1", 100.0, True)]
    assert "| prompt-1 | 100.0 |" in (tmp_path / "phases.md").read_text()
    assert (tmp_path / "best" / "manifest.json").exists()


def test_a_budget_phase_plots_its_front_and_the_table_says_which_point_it_chose(tmp_path):
    pytest.importorskip("optuna")
    from conductor.optimizers import BudgetSpace, BudgetTuner

    space = BudgetSpace(max_steps=(1, 2), max_tokens_per_step=(8, 64), temperature=None)
    tuner = BudgetTuner(metric, space=space, n_trials=3, cost_unit="tokens")
    compiler = ConductorCompiler(metric, output_dir=tmp_path, prompt_search=SetInstructions(HINT), budget_tuner=tuner)
    compiled = compiler.compile(student(), trainset=EXAMPLES)
    rows = json.loads((tmp_path / "phases.json").read_text())
    assert [r["phase"] for r in rows] == ["start", "prompt-1", "budget"]
    point = tuner.pick()
    assert rows[-1]["change"].startswith(f"Optuna's pick (trial {point.trial}; front in pareto.png): max_steps=")
    assert rows[-1]["score"] == 100.0 and not rows[-1]["kept"]  # no better than prompt-1: prompt-1's program stays
    assert compiled.limits.max_steps == 5
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_a_phase_that_hurts_is_not_kept(tmp_path):
    program = student()
    program.orchestrate.signature = program.orchestrate.signature.with_instructions(HINT)
    compiled = ConductorCompiler(metric, output_dir=tmp_path, prompt_search=SetInstructions("Be creative.")).compile(
        program, trainset=EXAMPLES
    )
    assert compiled.orchestrate.signature.instructions == HINT
    rows = json.loads((tmp_path / "phases.json").read_text())
    assert rows[-1]["phase"] == "prompt-1" and rows[-1]["score"] == 0.0 and not rows[-1]["kept"]
    # the phase that was not kept is saved all the same, as it was scored
    not_kept = load_program(tmp_path / "phases" / "1-prompt-1", trust_code=True)
    assert not_kept.orchestrate.signature.instructions == "Be creative."
    start = load_program(tmp_path / "phases" / "0-start", trust_code=True)
    assert start.orchestrate.signature.instructions == HINT


def test_a_stopped_compile_resumes_without_repeating_finished_phases(tmp_path):
    search = SetInstructions(HINT, fail_on_call=2)
    compiler = ConductorCompiler(metric, output_dir=tmp_path, prompt_search=search, rounds=2)
    with pytest.raises(KeyboardInterrupt):
        compiler.compile(student(), trainset=EXAMPLES)
    assert json.loads((tmp_path / "compiler_state.json").read_text())["done"] == ["prompt-1"]
    search.fail_on_call = None
    compiled = compiler.compile(student(), trainset=EXAMPLES)
    assert search.calls == 3  # prompt-1 once, prompt-2 failed once and then ran once: prompt-1 was not redone
    assert compiled.orchestrate.signature.instructions == HINT  # restored from the checkpoint, not the new student
    phases = [r["phase"] for r in json.loads((tmp_path / "phases.json").read_text())]
    assert phases == ["start", "prompt-1", "prompt-2"]


def test_a_compile_whose_best_program_is_gone_reruns_its_phases_from_the_student_keeping_the_start(tmp_path, caplog):
    # what a fresh clone has: the state and reports were committed, the saved program (its weights) was not
    search = SetInstructions(HINT)
    ConductorCompiler(metric, output_dir=tmp_path, prompt_search=search).compile(student(), trainset=EXAMPLES)
    first = json.loads((tmp_path / "compiler_state.json").read_text())
    shutil.rmtree(tmp_path / "best")
    scored: list[Any] = []

    def counting(example, prediction, trace=None):
        scored.append(example)
        return metric(example, prediction, trace)

    with caplog.at_level(logging.WARNING, logger="conductor"):
        compiled = ConductorCompiler(counting, output_dir=tmp_path, prompt_search=search).compile(
            student(), trainset=EXAMPLES
        )
    assert "run again from the student as given" in caplog.text
    assert search.calls == 2 and compiled.orchestrate.signature.instructions == HINT
    assert len(scored) == len(EXAMPLES)  # prompt-1 scored again; the start was not
    state = json.loads((tmp_path / "compiler_state.json").read_text())
    assert state["records"][0] == first["records"][0] and state["done"] == ["prompt-1"]
    assert [r["phase"] for r in state["records"]] == ["start", "prompt-1"]
    assert load_program(tmp_path / "best", trust_code=True).orchestrate.signature.instructions == HINT


def test_bad_input_is_refused_clearly(tmp_path):
    compiler = ConductorCompiler(metric, output_dir=tmp_path, prompt_search=SetInstructions(HINT))
    with pytest.raises(ConductorError, match="non-empty trainset"):
        compiler.compile(student(), trainset=[])

    def broken(example, prediction, trace=None):
        raise KeyError("label")

    with pytest.raises(ConductorError, match="the metric raised"):
        ConductorCompiler(broken, output_dir=tmp_path / "b", prompt_search=SetInstructions(HINT)).compile(
            student(), trainset=EXAMPLES
        )
    with pytest.raises(ConductorError, match="nothing to compile"):
        ConductorCompiler(metric, output_dir=tmp_path / "c").compile(student(), trainset=EXAMPLES)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "compiler_state.json").write_text("{half")
    with pytest.raises(ConductorError, match="damaged"):
        ConductorCompiler(metric, output_dir=tmp_path / "d", prompt_search=SetInstructions(HINT)).compile(
            student(), trainset=EXAMPLES
        )


def test_a_weight_phase_that_does_not_help_leaves_the_best_program_s_weights_as_they_were(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from conductor.conductor_lm import ConductorLM
    from conductor.deploy import load_program
    from conductor.local import trainable_policy
    from conductor.optimizers import TemplateWarmStartConfig, templated_workflows, warm_start
    from conductor.optimizers._checkpoint import checkpoints

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = ConductorLM.tiny(seed=0)
    program = Conductor(WorkerPool.from_config(POOL), policy.as_dspy_lm(max_tokens=8))
    examples = [e.copy(family="sum") for e in EXAMPLES]
    # teaches the title tool, which never answers: validation stays at 0, so the phase is not kept
    warm = TemplateWarmStartConfig(
        templates={"sum": [{"worker": "title", "subtask": "Hi.", "access": []}]},
        pools_per_question=1,
        training={"steps": 2, "lr": 0.05, "max_length": 4096},
    )
    before = policy.trainable_state()
    compiled = ConductorCompiler(metric, output_dir=tmp_path, template_warm_start=warm).compile(
        program, trainset=examples
    )
    rows = json.loads((tmp_path / "phases.json").read_text())
    assert [(r["phase"], r["kept"]) for r in rows] == [("start", True), ("template-warm-start", False)]
    # the warm start's last checkpoint, which a compile killed before the phase was recorded goes on from
    assert [p.name for p in checkpoints(tmp_path / "warm_start" / "template-warm-start")] == ["step-00000002"]
    unchanged = [
        trainable_policy(compiled.orchestrate.lm),
        trainable_policy(load_program(tmp_path / "best", trust_code=True).orchestrate.lm),
    ]
    for kept in unchanged:
        assert all(torch.equal(a, b) for a, b in zip(before, kept.trainable_state(), strict=True))
    # the phase's own program holds the weights it was scored with, saved before they were restored
    trained = load_program(tmp_path / "phases" / "1-template-warm-start", trust_code=True)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(before, trainable_policy(trained.orchestrate.lm).trainable_state(), strict=True)
    )
    # the phase did train: the same warm start outside the compiler moves the weights
    pairs = templated_workflows(program.pool, examples, warm.templates, label="family", pools_per_question=1)
    warm_start(policy, program, pairs, warm.training)
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.trainable_state(), strict=True))


def one_of(example, prediction, trace=None):
    return prediction.answer in example.accepted


def test_each_phase_is_compared_with_its_start_question_by_question(tmp_path):
    title_says = student()(question="What is 17 * 23 + 4? (t)").answer  # what the unhinted start answers
    accepted = [("395", title_says)] + [("395",)] * 3 + [(title_says,)] * 2 + [("nothing",)]
    valset = [
        dspy.Example(question="What is 17 * 23 + 4? (t)", accepted=answers).with_inputs("question")
        for answers in accepted
    ]
    ConductorCompiler(one_of, output_dir=tmp_path, prompt_search=SetInstructions(HINT)).compile(
        student(), trainset=valset, valset=valset
    )
    (row,) = json.loads((tmp_path / "paired.json").read_text())["validation"]
    counts = {k: row[k] for k in ("a", "b", "n", "both_right", "only_a", "only_b", "neither")}
    assert counts == {"a": "start", "b": "prompt-1", "n": 7, "both_right": 1, "only_a": 2, "only_b": 3, "neither": 1}
    assert (row["accuracy_a"], row["accuracy_b"], row["difference"]) == pytest.approx((3 / 7, 4 / 7, 1 / 7))
    assert (row["low"], row["high"]) == pytest.approx(paired_difference_interval(1, 2, 3, 1))
    assert row["p_value"] == 1.0  # 2 against 3 discordant questions: as likely as not
    assert "| prompt-1 | start | 7 | 1 | 3 | 2 | 1 | 0.571 | 0.429 | +14.3 (" in (tmp_path / "paired.md").read_text()
    state = json.loads((tmp_path / "compiler_state.json").read_text())
    assert state["validation_scores"] == {"start": [1, 0, 0, 0, 1, 1, 0], "prompt-1": [1, 1, 1, 1, 0, 0, 0]}


COIN_POOL = {"workers": [{"name": "coin", "kind": "tool", "tool": "tests.optimizers.test_compiler:coin"}]}
TOSSES = itertools.count()


def coin(text: str) -> str:
    """A worker whose every call answers differently: heads, tails, heads, ..."""
    return ("heads", "tails")[next(TOSSES) % 2]


class CoinEngine(ScriptedEngine):
    """Always sends the whole question to the coin; saveable with its LM."""

    def __init__(self):
        super().__init__(lambda prompt: 'model_id = [0]\nsubtasks = ["toss"]\naccess_list = [[]]')

    def dump_state(self) -> dict[str, Any]:
        return {}

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> "CoinEngine":
        return cls()


def heads(example, prediction, trace=None):
    return prediction.answer == "heads"


def test_every_phase_scored_on_the_test_split_shares_the_workers_samples(tmp_path):
    lm = dspy.LM("scripted/coin", engine=CoinEngine(), cache=False, num_retries=0)
    program = Conductor(WorkerPool.from_config(COIN_POOL), lm)
    compiler = ConductorCompiler(heads, output_dir=tmp_path, prompt_search=SetInstructions("Toss."))
    compiler.compile(program, trainset=EXAMPLES)
    test = [dspy.Example(question=f"Toss {i}.").with_inputs("question") for i in range(5)]
    (row,) = compiler.score_phases(test)
    # both programs sent the coin the same prompts: one toss each, seen by both. Without shared samples the second
    # program's five tosses would come after the first's five, every one the other side (5 is odd).
    assert (row.a, row.b, row.n, row.only_a, row.only_b) == ("start", "prompt-1", 5, 0, 0)
    assert row.both_right in (2, 3) and row.both_right + row.neither == 5
    paired = json.loads((tmp_path / "paired.json").read_text())
    assert paired["test"] == [row.as_dict()] and len(paired["validation"]) == 1
    assert "## test" in (tmp_path / "paired.md").read_text()


def test_a_small_validation_set_is_warned_about_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="conductor"):
        ConductorCompiler(metric, output_dir=tmp_path, prompt_search=SetInstructions(HINT)).compile(
            student(), trainset=EXAMPLES
        )
        warn_if_small(60)
    warnings = [r.getMessage() for r in caplog.records if "validation set" in r.getMessage()]
    assert warnings == [
        "the validation set has 3 questions: one question is 33.3 points; a gain under 37 points can't be told from "
        "noise (use at least 60 validation questions)"
    ]
