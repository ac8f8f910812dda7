"""Budget trials from several machines in one Optuna study, stood in for by two processes on one PostgreSQL database."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.optimizers import BudgetTuner
from conductor.optimizers._optuna import storage_url
from tests.optimizers.test_budget import exact

optuna = pytest.importorskip("optuna")
pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]
TUNE = """
import sys
from conductor.optimizers import BudgetTuner
from tests.optimizers.test_budget import SPACE, VAL, exact, make_program
BudgetTuner(exact, space=SPACE, storage=sys.argv[1], n_trials=3, seed=int(sys.argv[2])).optimize(make_program(), VAL)
"""


def test_a_plain_postgresql_url_names_the_psycopg_driver():
    assert storage_url("postgresql://u@h/db") == storage_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert storage_url("sqlite:///budget.db") == "sqlite:///budget.db" and storage_url(None) is None


def test_two_processes_run_their_budget_trials_into_one_postgresql_study(postgres_url):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", TUNE, postgres_url]
    tuners = [subprocess.Popen([*command, str(seed)], cwd=ROOT, env=env, stderr=subprocess.PIPE) for seed in (0, 1)]
    for tuner in tuners:
        assert tuner.wait(300) == 0, tuner.stderr.read().decode()
    study = optuna.load_study(study_name="conductor-budget", storage=storage_url(postgres_url))
    assert sorted(trial.number for trial in study.trials) == list(range(6))
    finished = {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}  # pruned: no worker was chosen
    assert {trial.state for trial in study.trials} <= finished
    front = BudgetTuner(exact, storage=postgres_url).pareto_front()  # a third machine reads what both found
    assert front and {point.trial for point in front} <= set(range(6))
