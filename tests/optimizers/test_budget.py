"""BudgetTuner on a scripted conductor and priced scripted workers: trials run, the front is non-dominated, points are
picked by constraint and applied, studies resume from SQLite, and bad input fails clearly with nothing written."""

import hashlib
import re
import shutil
import sys

import dspy
import optuna
import pydantic
import pytest

from conductor.errors import ConductorError, ConfigError, MissingDependency
from conductor.modules import Conductor, Price, WorkerPool
from conductor.optimizers._budget import BudgetSpace, BudgetTuner, TunedPoint
from conductor.testing import ScriptedWorker, scripted_lm

LONG_ANSWER = "step\n" * 30 + "Answer: 42"  # cut short by a small max_tokens_per_step, and then wrong


def conductor_script(prompt: str) -> str:
    """As many steps as allowed: the first ones think on Model 0, the last answers on the last model offered."""
    steps = int(re.search(r"Max steps:\n(\d+)", prompt)[1])
    last = len(re.findall(r"^Model \d+", prompt, re.M)) - 1
    workers = [0] * (steps - 1) + [last]
    subtasks = ", ".join(f'"step {i}"' for i in range(steps))
    return f"model_id = {workers}\nsubtasks = [{subtasks}]\naccess_list = {['all'] * steps}"


def make_program(*, workers: int = 2) -> Conductor:
    pool = [
        ScriptedWorker("cheap", lambda _: "Answer: 0", price=Price(0.001, 0.001)),
        ScriptedWorker("pricey", lambda _: LONG_ANSWER, price=Price(0.01, 0.03)),
    ]
    return Conductor(WorkerPool(pool[-workers:]), scripted_lm(conductor_script))


VAL = [dspy.Example(question=f"q{i}", answer="42").with_inputs("question") for i in range(3)]
SPACE = BudgetSpace(max_tokens_per_step=(16, 128), choose_workers=True)


def exact(example, prediction) -> float:
    return float(prediction.answer == example.answer)


def dominates(a: TunedPoint, b: TunedPoint) -> bool:
    return a.accuracy >= b.accuracy and a.cost <= b.cost and (a.accuracy > b.accuracy or a.cost < b.cost)


def completed(study) -> list:
    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def digest(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def test_trials_run_and_the_front_is_non_dominated():
    tuner = BudgetTuner(exact, space=SPACE, n_trials=10, seed=1)
    front = tuner.optimize(make_program(), VAL)
    assert len(tuner.study.trials) == 10 and front
    assert not any(dominates(a, b) for a in front for b in front)
    points = [TunedPoint(t.number, t.params, *t.values) for t in completed(tuner.study)]
    for point in points:  # every trial off the front is dominated by, or equal to, a point on it
        assert any(dominates(f, point) or (f.accuracy, f.cost) == (point.accuracy, point.cost) for f in front)
    assert [p.cost for p in front] == sorted(p.cost for p in front)
    assert {p.accuracy for p in points} == {0.0, 1.0}  # the pricey worker with room to answer is right, else wrong


def test_pick_chooses_by_constraint_and_says_when_nothing_fits():
    tuner = BudgetTuner(exact, space=SPACE, n_trials=10, seed=1)
    front = tuner.optimize(make_program(), VAL)
    budget = front[len(front) // 2].cost
    chosen = tuner.pick(max_cost=budget)
    assert chosen.cost <= budget and chosen.accuracy == max(p.accuracy for p in front if p.cost <= budget)
    good = tuner.pick(min_accuracy=1.0)
    assert good.accuracy == 1.0 and good.cost == min(p.cost for p in front if p.accuracy == 1.0)
    assert tuner.pick() == max(front, key=lambda p: (p.accuracy, -p.cost))
    with pytest.raises(ConductorError, match=r"no point of the Pareto front has cost <= -1 \(cost in usd\)"):
        tuner.pick(max_cost=-1)
    with pytest.raises(ConductorError, match=r"accuracy >= 1\.5"):
        tuner.pick(min_accuracy=1.5)


def test_apply_configures_a_copy_and_leaves_the_program_alone():
    program = make_program()
    prompts = []
    program.orchestrate.lm = scripted_lm(lambda p: prompts.append(p) or conductor_script(p))
    params = {
        "max_steps": 2,
        "max_tokens_per_step": 64,
        "temperature": 0.3,
        "worker:cheap": False,
        "worker:pricey": True,
    }
    configured = BudgetTuner(exact, space=SPACE).apply(program, params)
    assert configured.limits.max_steps == 2 and configured.executor.budget.max_tokens_per_step == 64
    assert configured.pool.names == configured.executor.pool.names == ["pricey"]
    assert configured.orchestrate.config["temperature"] == 0.3
    assert program.limits.max_steps == 5 and program.pool.names == ["cheap", "pricey"]
    assert program.executor.budget.max_tokens_per_step is None and "temperature" not in program.orchestrate.config

    prediction = configured(question="q")
    assert "Workers:\nModel 0\n\n" in prompts[-1] and "Max steps:\n2" in prompts[-1]
    assert [s.worker for s in prediction.trace] == ["pricey", "pricey"]
    assert all(s.completion_tokens <= 64 for s in prediction.trace) and prediction.answer == "42"
    with pytest.raises(ConfigError, match="no worker"):
        BudgetTuner(exact).apply(program, {**params, "worker:pricey": False})
    with pytest.raises(ConfigError, match="lacks"):
        BudgetTuner(exact).apply(program, {**params, "worker:ghost": True})


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A SQLite study of SPACE with 3 trials, made once (a fresh SQLite study takes most of a second)."""
    path = tmp_path_factory.mktemp("stored") / "study.db"
    BudgetTuner(exact, space=SPACE, storage=f"sqlite:///{path}", n_trials=3).optimize(make_program(), VAL)
    return path


@pytest.fixture
def storage(stored, tmp_path) -> str:
    """A copy of the stored study, as a storage URL."""
    shutil.copy(stored, tmp_path / "study.db")
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_a_study_resumes_from_sqlite_and_a_new_tuner_reads_its_front(storage):
    resumed = BudgetTuner(exact, space=SPACE, storage=storage, n_trials=3)
    resumed.optimize(make_program(), VAL, n_trials=2)
    study = optuna.load_study(study_name="conductor-budget", storage=storage)
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    reader = BudgetTuner(exact, storage=storage)
    assert reader.pareto_front() == resumed.pareto_front()


@pytest.mark.parametrize(
    "space, cost_unit, problem",
    [
        (BudgetSpace(max_tokens_per_step=(16, 128), max_steps=(1, 3), choose_workers=True), "usd", "max_steps: Int"),
        (BudgetSpace(max_tokens_per_step=(16, 128)), "usd", "parameters not in the current space: \\['worker:cheap'"),
        (SPACE.model_copy(update={"recursion_depth": (0, 2)}), "usd", "parameters its trials lack: \\['recursion_dep"),
        (SPACE, "tokens", "its costs are in 'usd', not 'tokens'"),
    ],
)
def test_a_stored_study_with_another_search_space_is_refused_and_left_untouched(storage, space, cost_unit, problem):
    path = storage.removeprefix("sqlite:///")
    before = digest(path)
    tuner = BudgetTuner(exact, space=space, storage=storage, cost_unit=cost_unit)
    with pytest.raises(ConductorError, match=f"made with another search space.*{problem}"):
        tuner.optimize(make_program(), VAL)
    assert digest(path) == before
    assert len(optuna.load_study(study_name="conductor-budget", storage=storage).trials) == 3


def test_bad_input_fails_before_the_study_is_opened(tmp_path):
    path = tmp_path / "study.db"
    tuner = BudgetTuner(lambda example, prediction: 1 / 0, storage=f"sqlite:///{path}")
    with pytest.raises(ConductorError, match="the metric raised on the first example \\(ZeroDivisionError"):
        tuner.optimize(make_program(), VAL)
    with pytest.raises(ConfigError, match="the validation set is empty"):
        tuner.optimize(make_program(), [])
    assert not path.exists()
    with pytest.raises(ConductorError, match="has no completed trials"):
        BudgetTuner(exact).pareto_front()
    with pytest.raises(pydantic.ValidationError, match="max_steps: low 4 > high 2"):
        BudgetSpace(max_steps=(4, 2))


def test_token_costs_and_at_least_one_worker_per_trial():
    tuner = BudgetTuner(exact, space=BudgetSpace(choose_workers=True), n_trials=6, cost_unit="tokens", seed=0)
    tuner.optimize(make_program(workers=1), VAL)
    states = {t.state for t in tuner.study.trials}
    assert states <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    assert optuna.trial.TrialState.PRUNED in states  # the trials that offered no worker ran nothing
    for trial in completed(tuner.study):
        assert trial.params["worker:pricey"] is True
        assert trial.values[1] == trial.user_attrs["tokens_per_question"] > 0


def test_compile_returns_the_program_configured_at_the_picked_point():
    tuner = BudgetTuner(exact, space=SPACE, n_trials=8, seed=1)
    compiled = tuner.compile(make_program(), trainset=VAL, min_accuracy=1.0)
    point = tuner.pick(min_accuracy=1.0)
    assert compiled.limits.max_steps == point.params["max_steps"]
    assert compiled.executor.budget.max_tokens_per_step == point.params["max_tokens_per_step"]
    assert compiled(question="q9").answer == "42"


def test_the_front_is_plotted(tmp_path):
    tuner = BudgetTuner(exact, space=SPACE, n_trials=4)
    tuner.optimize(make_program(), VAL)
    path = tuner.plot_front(tmp_path / "plots" / "front.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_optional_dependencies_name_the_extra_to_install(monkeypatch):
    tuner = BudgetTuner(exact, n_trials=1)  # the default space: every trial completes
    tuner.optimize(make_program(), VAL)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MissingDependency, match=r"matplotlib: pip install 'dspy-conductor\[tune\]'"):
        tuner.plot_front("front.png")
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(MissingDependency, match=r"Optuna: pip install 'dspy-conductor\[tune\]'"):
        BudgetTuner(exact).optimize(make_program(), VAL)
