"""``BudgetTuner``: Optuna's two-objective search over a Conductor's budgets, giving a quality/cost Pareto front.

Each trial configures a copy of the program (``apply``): the most steps a workflow may have, the most tokens a step
may write, the conductor's sampling temperature and, optionally, how many recursive rounds the conductor may add and
which workers the pool offers. It runs the copy on the validation set and records accuracy (maximised) and cost per
question (minimised: dollars from the pool's prices, or tokens, a conductor's own included). The user then picks a
point by a constraint: ``pick(max_cost=0.01)`` is the best accuracy under a cent a question.

Studies live in any Optuna storage (``sqlite:///study.db``) and resume: a later ``optimize`` adds trials to the same
study. A stored study made with another search space or cost unit is refused before anything is written to it, since
its trials could not be compared with the new ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import dspy
import pydantic
from dspy.teleprompt import Teleprompter

from conductor.errors import ConductorError, ConfigError, MissingDependency
from conductor.modules import Conductor
from conductor.optimizers._metric import WorkflowMetric
from conductor.optimizers._optuna import TUNE_EXTRA_HINT, import_optuna, storage_url
from conductor.optimizers._rewards import Metric

logger = logging.getLogger(__name__)

CostUnit = Literal["usd", "tokens"]
WORKER_PARAM = "worker:"
"""Prefix of the per-worker parameters (``worker:<name>``: does the pool offer this worker)."""


class BudgetSpace(pydantic.BaseModel):
    """The inclusive ranges a ``BudgetTuner`` searches; ``None`` leaves a dimension out of the search.
    ``max_tokens_per_step`` is searched on a log scale.

    ``recursion_depth`` is the Conductor's ``max_depth``. ``cost_penalty`` (a ``RewardConfig`` penalty per dollar)
    changes nothing a trial evaluates: it matters when training, and is recorded with each point for the trainer.
    Both are searched only when asked for.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    max_steps: tuple[pydantic.PositiveInt, pydantic.PositiveInt] = pydantic.Field(
        (1, 5), description="the range of the most steps a workflow may have"
    )
    max_tokens_per_step: tuple[pydantic.PositiveInt, pydantic.PositiveInt] | None = pydantic.Field(
        (64, 2048), description="the range of each worker call's most tokens (a log scale); None: not searched"
    )
    temperature: tuple[pydantic.NonNegativeFloat, pydantic.NonNegativeFloat] | None = pydantic.Field(
        (0.0, 1.0), description="the range of the conductor's sampling temperature; None: not searched"
    )
    cost_penalty: tuple[pydantic.NonNegativeFloat, pydantic.NonNegativeFloat] | None = pydantic.Field(
        None, description="the range of RewardConfig's penalty per dollar, recorded for training; None: not searched"
    )
    recursion_depth: tuple[pydantic.NonNegativeInt, pydantic.NonNegativeInt] | None = pydantic.Field(
        None, description="the range of the Conductor's max_depth (recursive rounds); None: not searched"
    )
    choose_workers: bool = pydantic.Field(False, description="also search which workers of the pool each trial keeps")

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> BudgetSpace:
        ranges = {name: value for name, value in self if isinstance(value, tuple)}
        problems = [f"{name}: low {lo} > high {hi}" for name, (lo, hi) in ranges.items() if lo > hi]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def distributions(self, worker_names: Sequence[str]) -> dict[str, Any]:
        """The Optuna distribution of every searched parameter, by name: what a trial samples, and what a stored
        study's trials must match."""
        dists = import_optuna("Budget tuning").distributions
        out: dict[str, Any] = {"max_steps": dists.IntDistribution(*self.max_steps)}
        if self.max_tokens_per_step is not None:
            out["max_tokens_per_step"] = dists.IntDistribution(*self.max_tokens_per_step, log=True)
        if self.temperature is not None:
            out["temperature"] = dists.FloatDistribution(*self.temperature)
        if self.cost_penalty is not None:
            out["cost_penalty"] = dists.FloatDistribution(*self.cost_penalty)
        if self.recursion_depth is not None:
            out["recursion_depth"] = dists.IntDistribution(*self.recursion_depth)
        if self.choose_workers:
            out.update({WORKER_PARAM + name: dists.CategoricalDistribution((True, False)) for name in worker_names})
        return out


@dataclasses.dataclass(frozen=True)
class TunedPoint:
    """One evaluated configuration: its trial number, parameters, accuracy and cost per question."""

    trial: int
    params: dict[str, Any]
    accuracy: float
    cost: float


class BudgetTuner(Teleprompter):
    """Search budgets with Optuna for a quality/cost Pareto front; pick a point by a constraint and ``apply`` it.

    Args:
        metric: ``metric(example, prediction)`` in [0, 1]; accuracy is its mean over the validation set.
        space: what to search (see ``BudgetSpace``; the default searches steps, tokens per step and temperature).
        n_trials: trials per ``optimize`` / ``compile``.
        storage: an Optuna storage URL (``sqlite:///path/study.db``) to persist and resume the study, or a
            ``postgresql://`` one that tuners on several machines share (each runs its trials into the one study);
            ``None`` keeps it in memory, resumed only by later calls on this tuner.
        study_name: the study within the storage.
        cost_unit: ``"usd"`` (from the pool's prices) or ``"tokens"`` (prompt and completion tokens of the run, a
            conductor's own included).
        num_threads: validation examples run side by side within a trial.
        seed: the sampler's seed (offset by the trials already in the study, so a resumed run explores anew).

    ``study`` is the Optuna study once opened (for Optuna's own plots and analysis).
    """

    def __init__(
        self,
        metric: Metric,
        *,
        space: BudgetSpace | None = None,
        n_trials: int = 20,
        storage: str | None = None,
        study_name: str = "conductor-budget",
        cost_unit: CostUnit = "usd",
        num_threads: int = 1,
        seed: int = 0,
    ):
        if cost_unit not in ("usd", "tokens"):
            raise ConfigError(f"cost_unit must be 'usd' or 'tokens', not {cost_unit!r}")
        if n_trials < 1:
            raise ConfigError(f"n_trials must be at least 1, not {n_trials}")
        self.metric = metric
        self.space = space or BudgetSpace()
        self.n_trials = n_trials
        self.storage = storage_url(storage)
        self.study_name = study_name
        self.cost_unit = cost_unit
        self.num_threads = num_threads
        self.seed = seed
        self.study: Any = None  # optuna.Study, imported lazily

    # ---- searching -------------------------------------------------------------------------------------------------
    def compile(
        self,
        student: Conductor,
        *,
        trainset: Sequence[dspy.Example],
        valset: Sequence[dspy.Example] | None = None,
        max_cost: float | None = None,
        min_accuracy: float | None = None,
    ) -> Conductor:
        """The ``Teleprompter`` contract: ``optimize`` on ``valset`` (else ``trainset``), then ``apply`` the point
        ``pick(max_cost=..., min_accuracy=...)`` chooses."""
        self.optimize(student, trainset if valset is None else valset)
        return self.apply(student, self.pick(max_cost=max_cost, min_accuracy=min_accuracy))

    def optimize(
        self, program: Conductor, valset: Sequence[dspy.Example], n_trials: int | None = None
    ) -> list[TunedPoint]:
        """Run ``n_trials`` more trials (default: the tuner's) of ``program`` on ``valset``; return the front."""
        if not isinstance(program, Conductor):
            raise ConfigError(f"the program must be a Conductor, not {type(program).__name__}")
        if not valset:
            raise ConfigError("the validation set is empty: budget tuning needs examples to evaluate each trial on")
        optuna = import_optuna("Budget tuning")
        space = self.space.distributions(program.pool.names)
        WorkflowMetric(self.metric).check(program, valset[0])  # before the study is opened: nothing half-written
        study = self._open(space)

        def objective(trial: Any) -> tuple[float, float]:
            params = {name: _suggest(trial, name, dist) for name, dist in space.items()}
            if self.space.choose_workers and not any(params[WORKER_PARAM + n] for n in program.pool.names):
                raise optuna.TrialPruned("no worker chosen")
            accuracy, usd, tokens = self._evaluate(self.apply(program, params), valset)
            trial.set_user_attr("usd_per_question", usd)
            trial.set_user_attr("tokens_per_question", tokens)
            logger.info(
                "trial %d: accuracy %.3f, $%.6f, %.0f tokens a question: %s",
                trial.number,
                accuracy,
                usd,
                tokens,
                params,
            )
            return accuracy, usd if self.cost_unit == "usd" else tokens

        study.optimize(objective, n_trials=n_trials or self.n_trials)
        return self.pareto_front()

    def _open(self, space: dict[str, Any]) -> Any:
        """This tuner's study: created, or loaded from storage after checking it was made with ``space``."""
        optuna = import_optuna("Budget tuning")
        if self.study is None:
            self.study = _create_or_load(optuna, self.storage, self.study_name)
        study = self.study
        problems = _mismatch(study, space, self.cost_unit)
        if problems:
            where = f"in {self.storage}" if self.storage else "in memory"
            raise ConductorError(
                f"the study {self.study_name!r} {where} was made with another search space, so its trials can't be "
                f"compared with new ones: {'; '.join(problems)}. Use another study_name or storage, or that space."
            )
        if "cost_unit" not in study.user_attrs:
            study.set_user_attr("cost_unit", self.cost_unit)
        study.sampler = optuna.samplers.TPESampler(seed=self.seed + len(study.trials))
        return study

    def _evaluate(self, program: Conductor, valset: Sequence[dspy.Example]) -> tuple[float, float, float]:
        """Mean metric, dollars and tokens per question of ``program`` on ``valset``."""
        evaluate = dspy.Evaluate(
            devset=list(valset), metric=WorkflowMetric(self.metric), num_threads=self.num_threads, failure_score=0.0
        )
        results = evaluate(program).results
        n = len(valset)
        return (
            sum(score for _, _, score in results) / n,
            sum(getattr(prediction, "cost", 0.0) for _, prediction, _ in results) / n,
            sum(getattr(prediction, "tokens", 0) for _, prediction, _ in results) / n,
        )

    # ---- choosing --------------------------------------------------------------------------------------------------
    def pareto_front(self) -> list[TunedPoint]:
        """The non-dominated completed trials (no other is at least as accurate and as cheap, and better in one),
        cheapest first."""
        return sorted((_point(t) for t in self._stored().best_trials), key=lambda p: (p.cost, -p.accuracy))

    def pick(self, *, max_cost: float | None = None, min_accuracy: float | None = None) -> TunedPoint:
        """The front's point that meets the constraints: the most accurate within ``max_cost`` (the cheaper on a
        tie), or with only ``min_accuracy`` the cheapest that reaches it; with neither, the most accurate."""
        front = self.pareto_front()
        fits = [
            p
            for p in front
            if (max_cost is None or p.cost <= max_cost) and (min_accuracy is None or p.accuracy >= min_accuracy)
        ]
        if not fits:
            wanted = [f"cost <= {max_cost:g}"] if max_cost is not None else []
            wanted += [f"accuracy >= {min_accuracy:g}"] if min_accuracy is not None else []
            points = ", ".join(f"(accuracy {p.accuracy:.3f}, cost {p.cost:g})" for p in front)
            raise ConductorError(
                f"no point of the Pareto front has {' and '.join(wanted)} (cost in {self.cost_unit}); "
                f"the front: {points}"
            )
        if min_accuracy is not None and max_cost is None:
            return min(fits, key=lambda p: (p.cost, -p.accuracy))
        return max(fits, key=lambda p: (p.accuracy, -p.cost))

    def apply(self, program: Conductor, point: TunedPoint | Mapping[str, Any]) -> Conductor:
        """A copy of ``program`` configured with ``point``'s parameters; ``program`` itself is not changed."""
        params = dict(point.params if isinstance(point, TunedPoint) else point)
        names = program.pool.names
        unknown = sorted(k for k in params if k.startswith(WORKER_PARAM) and k[len(WORKER_PARAM) :] not in names)
        if unknown:
            raise ConfigError(f"the point chooses workers this pool lacks: {unknown} (the pool: {names})")
        kept = [name for name in names if params.get(WORKER_PARAM + name, True)]
        if not kept:
            raise ConfigError("the point offers no worker")
        budget = program.executor.budget
        if "max_tokens_per_step" in params:
            budget = dataclasses.replace(budget, max_tokens_per_step=params["max_tokens_per_step"])
        pool = (
            program.pool.subset([i for i, name in enumerate(names) if name in kept]) if len(kept) < len(names) else None
        )
        configured = program.deepcopy().copy_with(pool=pool, budget=budget)
        configured.limits = dataclasses.replace(configured.limits, max_steps=params["max_steps"])
        if "recursion_depth" in params:
            configured.max_depth = params["recursion_depth"]
        if "temperature" in params:
            configured.orchestrate.config = {**configured.orchestrate.config, "temperature": params["temperature"]}
        return configured

    def plot_front(self, path: str | Path) -> Path:
        """Write a PNG of every completed trial (accuracy against cost per question) with the front highlighted."""
        try:
            from matplotlib.figure import Figure
        except ImportError as exc:
            raise MissingDependency(f"Plotting the front needs matplotlib: {TUNE_EXTRA_HINT} ({exc})") from exc
        trials = [_point(t) for t in self._stored().get_trials(deepcopy=False, states=_complete())]
        front = self.pareto_front()
        figure = Figure(figsize=(6, 4), layout="tight")
        axes = figure.subplots()
        axes.scatter([p.cost for p in trials], [p.accuracy for p in trials], color="0.7", label="trials")
        front_costs, front_accuracies = [p.cost for p in front], [p.accuracy for p in front]
        axes.plot(front_costs, front_accuracies, "o-", color="C3", drawstyle="steps-post", label="Pareto front")
        axes.set_xlabel("dollars per question" if self.cost_unit == "usd" else "tokens per question")
        axes.set_ylabel("accuracy")
        axes.set_title(f"{self.study_name}: {len(trials)} trials")
        axes.grid(alpha=0.3)
        axes.legend()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png", dpi=120)
        return path

    def _stored(self) -> Any:
        """The study to read results from: this tuner's, else the stored one of that name."""
        optuna = import_optuna("Budget tuning")
        if self.study is None and self.storage is not None:
            with contextlib.suppress(KeyError):  # no such study: reported below
                self.study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        if self.study is None or not self.study.get_trials(deepcopy=False, states=_complete()):
            raise ConductorError(
                f"the study {self.study_name!r} has no completed trials: "
                "run optimize(), with more trials if all were pruned"
            )
        return self.study


def _suggest(trial: Any, name: str, distribution: Any) -> Any:
    """Sample ``name`` from ``distribution`` through the trial's public API (define-by-run)."""
    dists = import_optuna("Budget tuning").distributions
    if isinstance(distribution, dists.IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, log=distribution.log)
    if isinstance(distribution, dists.FloatDistribution):
        return trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log)
    return trial.suggest_categorical(name, distribution.choices)


def _create_or_load(optuna: Any, storage: str | None, name: str) -> Any:
    """The study ``name``, created or loaded. Machines that start one study at once on a fresh database race to create
    Optuna's tables: the loser's CREATE fails on a unique constraint, and trying again finds them made."""
    import sqlalchemy.exc  # Optuna's own dependency, for its database storages

    def create() -> Any:
        return optuna.create_study(
            storage=storage, study_name=name, directions=["maximize", "minimize"], load_if_exists=True
        )

    for _ in range(2):
        try:
            return create()
        except sqlalchemy.exc.DBAPIError:
            time.sleep(0.5)
    return create()  # a third failure is not the race


def _mismatch(study: Any, space: dict[str, Any], cost_unit: CostUnit) -> list[str]:
    """Why ``study``'s trials can't be compared with trials of ``space`` in ``cost_unit`` (empty when they can)."""
    optuna = import_optuna("Budget tuning")
    problems = []
    if list(study.directions) != [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]:
        problems.append(f"its objectives are {[d.name.lower() for d in study.directions]}, not [maximize, minimize]")
    stored_unit = study.user_attrs.get("cost_unit", cost_unit)
    if stored_unit != cost_unit:
        problems.append(f"its costs are in {stored_unit!r}, not {cost_unit!r}")
    dropped, changed, missing = set(), {}, set()
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            if name not in space:
                dropped.add(name)
            elif distribution != space[name]:
                changed[name] = f"{name}: {distribution} -> {space[name]}"
        if trial.state == optuna.trial.TrialState.COMPLETE:
            missing |= space.keys() - trial.distributions.keys()
    if dropped:
        problems.append(f"parameters not in the current space: {sorted(dropped)}")
    if missing:
        problems.append(f"parameters its trials lack: {sorted(missing)}")
    problems += [changed[name] for name in sorted(changed)]
    return problems


def _complete() -> tuple[Any, ...]:
    return (import_optuna("Budget tuning").trial.TrialState.COMPLETE,)


def _point(trial: Any) -> TunedPoint:
    accuracy, cost = trial.values
    return TunedPoint(trial.number, dict(trial.params), accuracy, cost)
