"""The experiment config (pool, datasets, methods, seeds, threads, output), validated all at once with pydantic, and
the registries that build datasets and methods by name.

Example (paths are relative to the config file)::

    title: Controlled comparison
    pool: default                     # the embedded local pool; or a pool file; or {simulated: {models: [...]}}
    datasets:
      - {name: gsm8k, n: 20}          # n items of the seeded test split (split seed `seed`, default 0)
      - {name: bigbench, args: {task: arithmetic}, n: 20}
      - {name: file, args: {path: mine.jsonl, metric: number}, n: 20, label: mine}   # one's own data (DataFile)
    methods:
      - {name: single-smollm2, type: single, args: {worker: 0}}
      - {name: plain-smollm2, type: plain_chat, args: {worker: 0}}   # the question alone, as a user asks
      - {name: conductor, type: conductor, args: {lm: local/smollm2-135m-instruct}}
    seeds: [0]
    threads: 2
    output: ../results/local_headline
    ray: auto                         # optional: run the units on the Ray cluster at this address (see `ray`)

A run seed feeds every stochastic part that takes one: the simulated pool and ``random`` workflows. The examples
are the same for every seed and method (they depend on the dataset's own split ``seed`` only).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dspy
import pydantic
import yaml

from conductor._files import ConfigPath, config_folder_or_name, config_relative
from conductor._imports import import_object
from conductor.bench.datasets import (
    BUILTIN_METRICS,
    DataFile,
    MetricName,
    load_bbh,
    load_bigbench,
    load_gsm8k,
    load_gsm_symbolic,
    load_humaneval,
    load_mmlu,
    metric,
    split,
)
from conductor.bench.datasets._dispatch import Metric
from conductor.bench.simulated import PAPER_MODELS, simulated_dataset, simulated_metric, simulated_pool
from conductor.deploy import conductor_lm, load_program, program_digest
from conductor.errors import ConfigError, invalid_config, validation_problems
from conductor.modules import Budget, Conductor, PoolProgram, ReplayStore, WorkerPool
from conductor.modules.baselines import (
    FixedPipeline,
    MixtureOfAgents,
    OneStepRouter,
    PlainChat,
    RandomWorkflow,
    SelfConsistency,
    SingleWorker,
    plan_solve_verify,
    solve_verify_refine,
)

Part = Literal["train", "val", "test", "all"]
WorkerIndex = pydantic.NonNegativeInt


class _Spec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


# ---- datasets ------------------------------------------------------------------------------------------------------
class _NoArgs(_Spec):
    pass


class _MMLUArgs(_Spec):
    subjects: list[str] | None = pydantic.Field(
        None, description="only the questions of these subjects (e.g. 'college mathematics'); None: all"
    )


class _BigbenchArgs(_Spec):
    task: str = pydantic.Field(description="the BIG-bench task, e.g. 'arithmetic' or 'navigate'")
    subtask: str | None = pydantic.Field(None, description="one of its subtasks; None: all of them")


class _BbhArgs(_Spec):
    task: str = pydantic.Field(
        description="the BIG-Bench-Hard task, e.g. 'word_sorting' or 'tracking_shuffled_objects_three_objects'"
    )


class _SimulatedArgs(_Spec):
    family: str = pydantic.Field(description="the SIMULATED task family, e.g. 'math500' (labelled 'sim/math500')")


class _FileArgs(DataFile):
    """A local data file (its path relative to the config file) and the metric that scores it."""

    metric: MetricName = pydantic.Field(
        "exact", description=f"one of {list(BUILTIN_METRICS)}, or 'module:function'(example, prediction)"
    )


@dataclass(frozen=True)
class DatasetType:
    """How to get ``n`` examples of a dataset for a seed, and how to score them.

    A fixed benchmark (``load(**args)``) is shuffled into seeded train / val / test parts and the first ``n`` of
    ``part`` are taken (``all``: the whole benchmark shuffled), so a larger ``n`` extends a smaller one. A
    ``generated`` one (``load(n, seed, **args)``) makes fresh items for each seed; ``part`` does not apply to it.
    """

    args: type[pydantic.BaseModel]
    load: Callable[..., list[dspy.Example]]
    metric: Metric | None  # None: the args name it (``args.metric``)
    generated: bool = False

    def sample(self, args: pydantic.BaseModel, n: int, seed: int, part: Part) -> list[dspy.Example]:
        options = args.model_dump(exclude_none=True)
        if self.generated:
            return self.load(n, seed, **options)
        examples = self.load(**options)
        chosen = split(examples, seed, (1.0, 0.0, 0.0)).train if part == "all" else getattr(split(examples, seed), part)
        if len(chosen) < n:
            raise ConfigError(f"only {len(chosen)} examples in the {part!r} part, fewer than n={n}")
        return chosen[:n]


DATASETS: dict[str, DatasetType] = {
    "mmlu": DatasetType(_MMLUArgs, load_mmlu, metric),
    "gsm8k": DatasetType(_NoArgs, load_gsm8k, metric),
    "bigbench": DatasetType(_BigbenchArgs, load_bigbench, metric),
    "bbh": DatasetType(_BbhArgs, load_bbh, metric),
    "humaneval": DatasetType(_NoArgs, load_humaneval, metric),
    "gsm_symbolic": DatasetType(_NoArgs, load_gsm_symbolic, metric, generated=True),
    "simulated": DatasetType(
        _SimulatedArgs, lambda n, seed, family: simulated_dataset([family], n, seed), simulated_metric, generated=True
    ),
    "file": DatasetType(_FileArgs, lambda metric, **file: DataFile(**file).read(metric).examples, None),
}
"""Dataset loaders by config name. SIMULATED tasks are labelled as such (family ``sim/...``)."""


# ---- methods -------------------------------------------------------------------------------------------------------
class _SingleArgs(_Spec):
    worker: WorkerIndex = pydantic.Field(0, description="the index of the worker that answers")


class _SelfConsistencyArgs(_Spec):
    worker: WorkerIndex = pydantic.Field(0, description="the index of the worker sampled")
    k: int = pydantic.Field(5, ge=1, description="samples, seeing nothing; their majority answer wins")


class _MixtureArgs(_Spec):
    proposers: list[WorkerIndex] | None = pydantic.Field(
        None, description="the indices of the workers that answer independently; None: every worker"
    )
    aggregator: WorkerIndex = pydantic.Field(0, description="the index of the worker that combines their answers")


class _PlanSolveVerifyArgs(_Spec):
    planner: WorkerIndex = pydantic.Field(description="the index of the worker that plans, seeing nothing")
    solver: WorkerIndex = pydantic.Field(description="the index of the worker that solves following the plan")
    verifier: WorkerIndex = pydantic.Field(
        description="the index of the worker that verifies plan and solution and answers"
    )


class _SolveVerifyRefineArgs(_Spec):
    solver: WorkerIndex = pydantic.Field(description="the index of the worker that solves, seeing nothing")
    verifier: WorkerIndex = pydantic.Field(description="the index of the worker that checks the solution")
    refiner: WorkerIndex = pydantic.Field(
        description="the index of the worker that improves the solution using the check and answers"
    )


class _RandomArgs(_Spec):
    max_steps: int = pydantic.Field(5, ge=1, description="the most steps of a random workflow")


class _PipelineStepArgs(_Spec):
    """One step of a fixed workflow: its worker, role ("" is the default role), subtask, and the earlier steps it sees
    ("all", or their indices: [] for none)."""

    worker: WorkerIndex = pydantic.Field(description="the index of the step's worker")
    subtask: str = pydantic.Field(min_length=1, description="what the step asks its worker to do")
    role: str = pydantic.Field("", description="the step's role; '': the default role")
    access: Literal["all"] | list[pydantic.NonNegativeInt] = pydantic.Field(
        "all", description="the earlier steps it sees: 'all', or their indices ([] for none)"
    )


class _PipelineArgs(_Spec):
    steps: list[_PipelineStepArgs] = pydantic.Field(min_length=1, description="the workflow's steps, in order")


class _RouterArgs(_Spec):
    lm: str = pydantic.Field(min_length=1, description="a model string (local/<name>, litellm) or a checkpoint folder")
    max_tokens: int = pydantic.Field(384, gt=0, description="the most tokens of one of the LM's replies")
    temperature: float = pydantic.Field(0.0, ge=0, description="the LM's sampling temperature")
    fallback: Literal["first_worker", "none"] = pydantic.Field(
        "first_worker",
        description="on an unusable reply: 'first_worker' asks worker 0 the question directly (still counted a "
        "format error); 'none' returns no answer",
    )

    @pydantic.field_validator("lm")
    @classmethod
    def _checkpoint(cls, lm: str, info: pydantic.ValidationInfo) -> str:
        """A checkpoint folder relative to the config file becomes absolute; a model string stays as it is."""
        return config_folder_or_name(lm, info)


class _ConductorArgs(_RouterArgs):
    max_steps: int = pydantic.Field(5, ge=1, description="the most steps a workflow may have")
    grammar: bool = pydantic.Field(False, description="decode under the workflow grammar (a local conductor LM)")


@functools.cache
def cached_conductor_lm(name: str, max_tokens: int, temperature: float) -> dspy.BaseLM:
    """The conductor LM of a method (named as ``conductor.deploy.conductor_lm`` reads names), made once per process."""
    return conductor_lm(name, max_tokens=max_tokens, temperature=temperature)


class _ProgramArgs(_Spec):
    path: str = pydantic.Field(min_length=1, description="a saved program folder (conductor.save, conductor compile)")
    trust_code: bool = pydantic.Field(False, description="let it import code the library didn't ship (its author's)")
    workers: list[WorkerIndex] | None = pydantic.Field(
        None, min_length=1, description="the experiment's workers it runs over, in this order (default: all)"
    )
    max_depth: pydantic.NonNegativeInt | None = pydantic.Field(None, description="replaces its saved max_depth")

    @pydantic.field_validator("workers")
    @classmethod
    def _distinct(cls, workers: list[int] | None) -> list[int] | None:
        if workers is not None and len(set(workers)) != len(workers):
            raise ValueError(f"names a worker twice: {workers}")
        return workers

    @pydantic.field_validator("path")
    @classmethod
    def _folder(cls, path: str, info: pydantic.ValidationInfo) -> str:
        # a missing folder is the run's to judge: its recorded units may stand without it (see MethodSpec.gone)
        return str(config_relative(path, info))


def saved_program(pool: WorkerPool, args: _ProgramArgs, seed: int, budget: Budget) -> Conductor:
    """The saved program (its conductor LM, prompts, demos and limits) run over the experiment's workers: all of them
    by default, so that it is compared with the other methods on the same workers (the pools must then have the same
    size: workers are chosen by number), or ``args.workers``, to score it on a pool it was not trained on (another
    order, a subset, a worker it never saw). A worker of the same name as one the program was saved with answers in
    that one's framing (``Worker.framing``, as its pool config set it). ``args.max_depth`` replaces its recursion
    depth."""
    program = load_program(args.path, trust_code=args.trust_code)
    program.pool.close()
    if args.workers is None and len(program.pool) != len(pool):
        raise ConfigError(
            f"{args.path} was saved with {len(program.pool)} workers; this experiment's pool has {len(pool)}"
        )
    beyond = [i for i in args.workers or () if i >= len(pool)]
    if beyond:
        raise ConfigError(f"workers {beyond} of {args.path} are not in this experiment's pool of {len(pool)}")
    workers = pool if args.workers is None else pool.subset(args.workers)
    # each model's framing is the program's: kept on the experiment's worker of the same name
    framings = {worker.name: worker.framing for worker in program.pool if worker.name in workers.names}
    program = program.copy_with(pool=workers.framed(framings), budget=budget)
    if args.max_depth is not None:
        program.max_depth = args.max_depth
    if program.decoding_constraint is not None:
        _constrain(program)  # its grammar names the workers and the conductor's own id: rebuilt for this pool and depth
    return program


Builder = Callable[..., PoolProgram]
"""``(pool, args, seed, **options) -> program``; ``options`` are ``PoolProgram``'s (``budget``)."""


@dataclass(frozen=True)
class MethodType:
    """The arguments a method type takes, and how to build its program over a pool."""

    args: type[_Spec]
    build: Builder


def _lm(args: _RouterArgs) -> dspy.LM:
    return cached_conductor_lm(args.lm, args.max_tokens, args.temperature)


def _conductor(pool: WorkerPool, args: _ConductorArgs, seed: int, **options: Any) -> Conductor:
    program = Conductor(pool, _lm(args), max_steps=args.max_steps, fallback=args.fallback, **options)
    if args.grammar:
        _constrain(program)
    return program


def _constrain(program: Conductor) -> None:
    """Decode ``program``'s conductor under the workflow grammar of its pool and depth (needs the train extra)."""
    from conductor.conductor_lm import constrain_program

    constrain_program(program)


METHODS: dict[str, MethodType] = {
    "conductor": MethodType(_ConductorArgs, _conductor),
    "program": MethodType(_ProgramArgs, saved_program),
    "router": MethodType(_RouterArgs, lambda pool, a, seed, **o: OneStepRouter(pool, _lm(a), fallback=a.fallback, **o)),
    "single": MethodType(_SingleArgs, lambda pool, a, seed, **o: SingleWorker(pool, a.worker, **o)),
    "plain_chat": MethodType(_SingleArgs, lambda pool, a, seed, **o: PlainChat(pool, a.worker, **o)),
    "self_consistency": MethodType(
        _SelfConsistencyArgs, lambda pool, a, seed, **o: SelfConsistency(pool, a.worker, a.k, **o)
    ),
    "moa": MethodType(_MixtureArgs, lambda pool, a, seed, **o: MixtureOfAgents(pool, a.proposers, a.aggregator, **o)),
    "plan_solve_verify": MethodType(
        _PlanSolveVerifyArgs, lambda pool, a, seed, **o: plan_solve_verify(pool, a.planner, a.solver, a.verifier, **o)
    ),
    "solve_verify_refine": MethodType(
        _SolveVerifyRefineArgs,
        lambda pool, a, seed, **o: solve_verify_refine(pool, a.solver, a.verifier, a.refiner, **o),
    ),
    "random": MethodType(_RandomArgs, lambda pool, a, seed, **o: RandomWorkflow(pool, a.max_steps, seed, **o)),
    "pipeline": MethodType(
        _PipelineArgs,
        lambda pool, a, seed, **o: FixedPipeline(pool, [(s.worker, s.role, s.subtask, s.access) for s in a.steps], **o),
    ),
}
"""Method types by config name; ``seed`` is the run seed."""


def _parse_args(
    model: type[pydantic.BaseModel], args: dict[str, Any], info: pydantic.ValidationInfo
) -> pydantic.BaseModel:
    """``args`` validated by ``model``; every problem in one ``ValueError`` (pydantic then places it in the config)."""
    try:
        return model.model_validate(args, context=info.context)
    except pydantic.ValidationError as exc:
        raise ValueError("; ".join(f"args.{problem}" for problem in validation_problems(exc, model=model))) from None


# ---- the config ----------------------------------------------------------------------------------------------------
class SimulatedPoolArgs(_Spec):
    """``simulated_pool``'s arguments: the paper's models by name (default: all 7) and the workers' settings."""

    models: list[str] | None = pydantic.Field(
        None, description=f"the paper's models by name, of {list(PAPER_MODELS)}; None: all, in the paper's order"
    )
    copy_prob: float = pydantic.Field(
        0.5, ge=0, le=1, description="the chance that a step shown earlier answers copies their majority"
    )
    correlation: float = pydantic.Field(
        0.9, ge=0, le=1, description="the share of a call's correctness decided by the task's difficulty, not chance"
    )
    max_tokens: int = pydantic.Field(4096, gt=0, description="each worker's most tokens of one answer")
    temperature: float = pydantic.Field(0.2, ge=0, description="each worker's sampling temperature")

    @pydantic.field_validator("models")
    @classmethod
    def _known(cls, models: list[str] | None) -> list[str] | None:
        unknown = [m for m in models or [] if m not in PAPER_MODELS]
        if unknown:
            raise ValueError(f"unknown simulated models {unknown}; known: {list(PAPER_MODELS)}")
        return models


class SimulatedPool(_Spec):
    simulated: SimulatedPoolArgs = pydantic.Field(
        SimulatedPoolArgs(), description="a pool of SIMULATED workers (`simulated_pool`) made with these arguments"
    )


class BudgetSpec(_Spec):
    """``Budget`` per run of a method; ``None`` is unlimited."""

    max_steps: int | None = pydantic.Field(None, ge=1, description="the most steps a run may take")
    max_tokens: int | None = pydantic.Field(
        None, ge=1, description="the most prompt and completion tokens a run may spend, the conductor's included"
    )
    max_cost: float | None = pydantic.Field(None, gt=0, description="the most dollars a run may spend")
    max_tokens_per_step: int | None = pydantic.Field(None, ge=1, description="caps each worker call's max_tokens")


class DatasetSpec(_Spec):
    """``n`` examples of dataset ``name`` (a ``DATASETS`` key) loaded with ``args``; ``seed`` and ``part`` choose
    them. ``label`` names it in results (default: the name and the args' values, e.g. ``bigbench/arithmetic``)."""

    name: Literal[tuple(DATASETS)] = pydantic.Field(  # type: ignore[valid-type]
        description="the dataset (its `args` are listed by name below)"
    )
    args: dict[str, Any] = pydantic.Field({}, description="the dataset's arguments")
    n: int = pydantic.Field(gt=0, description="how many examples")
    seed: int = pydantic.Field(
        0, description="the seed of the benchmark's train / val / test split, or of a generated dataset's items"
    )
    part: Part = pydantic.Field(
        "test", description="the split the examples come from ('all': the whole benchmark); not for generated ones"
    )
    label: str = pydantic.Field("", description="its name in results; '': the name and the args' values")
    _parsed: pydantic.BaseModel = pydantic.PrivateAttr()

    @pydantic.model_validator(mode="after")
    def _check(self, info: pydantic.ValidationInfo) -> DatasetSpec:
        self._parsed = _parse_args(DATASETS[self.name].args, self.args, info)
        values = ("+".join(map(str, v)) if isinstance(v, list) else str(v) for v in self.args.values())
        self.label = self.label or "/".join([self.name, *values])
        return self

    def load(self) -> list[dspy.Example]:
        return DATASETS[self.name].sample(self._parsed, self.n, self.seed, self.part)

    @property
    def metric(self) -> Metric:
        fixed = DATASETS[self.name].metric
        if fixed is not None:
            return fixed
        return BUILTIN_METRICS.get(self._parsed.metric) or import_object(self._parsed.metric, "the metric ")

    def describe(self) -> str:
        """How the examples were chosen, for reports."""
        if DATASETS[self.name].generated:
            return f"{self.label} (n={self.n}, generated with seed {self.seed})"
        return f"{self.label} (n={self.n} of the {self.part} part, split seed {self.seed})"


class MethodSpec(_Spec):
    """A method to compare: ``type`` (a ``METHODS`` key) with its ``args``, named ``name`` in results."""

    name: str = pydantic.Field(min_length=1, description="the method's name in results")
    type: Literal[tuple(METHODS)] = pydantic.Field(  # type: ignore[valid-type]
        description="the method type (its `args` are listed by type below)"
    )
    args: dict[str, Any] = pydantic.Field({}, description="the method type's arguments")
    budget: BudgetSpec = pydantic.Field(BudgetSpec(), description="the limits of each of its runs")
    _parsed: _Spec = pydantic.PrivateAttr()

    @pydantic.model_validator(mode="after")
    def _check(self, info: pydantic.ValidationInfo) -> MethodSpec:
        self._parsed = _parse_args(METHODS[self.type].args, self.args, info)
        return self

    @property
    def gone(self) -> Path | None:
        """The saved program folder this method names, where it isn't there: checkpoints are run outputs that a clean
        clone lacks, while the units recorded with them are committed."""
        folder = Path(self._parsed.path) if isinstance(self._parsed, _ProgramArgs) else None
        return folder if folder is not None and not folder.is_dir() else None

    def build(self, pool: WorkerPool, seed: int) -> PoolProgram:
        """This method's program over ``pool`` for run seed ``seed``; ``ConfigError`` if the pool can't run it."""
        return METHODS[self.type].build(pool, self._parsed, seed, budget=Budget(**self.budget.model_dump()))


def _unique(values: Sequence[str], what: str) -> None:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{what} must be unique; repeated: {repeated}")


class BenchConfig(_Spec):
    """What to run: every method on every dataset for every seed, ``threads`` units at once, results in ``output``."""

    title: str = pydantic.Field("Benchmark", description="the results report's title")
    pool: str | SimulatedPool = pydantic.Field(
        "default", description="'default' (the embedded local pool), a pool file, or a simulated pool"
    )
    datasets: list[DatasetSpec] = pydantic.Field(min_length=1, description="the datasets every method runs on")
    methods: list[MethodSpec] = pydantic.Field(min_length=1, description="the methods compared")
    seeds: list[int] = pydantic.Field(
        [0], min_length=1, description="run seeds: every method runs on every dataset once per seed"
    )
    threads: int = pydantic.Field(1, ge=1, description="units (a method on one example for one seed) run at once")
    output: ConfigPath = pydantic.Field(description="the results folder")
    replay_store: ConfigPath | None = pydantic.Field(
        None,
        description="a file where the pool's `replay` workers keep their completions, shared by this run's processes "
        "and by other runs that name it (their methods then draw on the same samples); None: each process its own",
    )
    ray: str | None = pydantic.Field(
        None,
        min_length=1,
        description="run the units in one actor per CPU of the Ray cluster at this address ('auto': the one `ray "
        "start` runs; 'local': a new one; 'ray://host:10001'), `threads` at once in each; None: in this process",
    )
    _source: Path | None = pydantic.PrivateAttr(None)

    @pydantic.field_validator("pool")
    @classmethod
    def _pool_file(cls, pool: str | SimulatedPool, info: pydantic.ValidationInfo) -> str | SimulatedPool:
        if isinstance(pool, SimulatedPool) or pool == "default":
            return pool
        path = config_relative(pool, info)
        if not path.is_file():
            raise ValueError(f"the pool file {path} does not exist (use a path, 'default' or {{simulated: {{}}}})")
        return str(path)

    @pydantic.model_validator(mode="after")
    def _names(self) -> BenchConfig:
        _unique([m.name for m in self.methods], "method names")
        _unique([d.label for d in self.datasets], "dataset labels")
        _unique([str(s) for s in self.seeds], "seeds")
        return self

    @property
    def source(self) -> Path | None:
        """The config file this was read from, if any (reports show the command that reproduces them)."""
        return self._source

    @property
    def simulated(self) -> bool:
        """Whether any number of this run is SIMULATED (a simulated pool or simulated tasks)."""
        return isinstance(self.pool, SimulatedPool) or any(d.name == "simulated" for d in self.datasets)

    def build_pool(self, seed: int) -> WorkerPool:
        """The pool for run seed ``seed`` (only a simulated pool depends on it)."""
        if isinstance(self.pool, SimulatedPool):
            return simulated_pool(**self.pool.simulated.model_dump(), seed=seed)
        if self.pool == "default":
            return WorkerPool.default()
        store = None if self.replay_store is None else ReplayStore(self.replay_store)
        return WorkerPool.from_file(self.pool, replay_store=store)

    def fingerprint(self, method: MethodSpec, dataset: DatasetSpec) -> str:
        """A hash of everything that decides a unit's result besides its seed and example: the pool, the method and
        how the dataset is loaded. A resumed run recomputes units recorded under another fingerprint."""
        pool = self.pool.model_dump() if isinstance(self.pool, SimulatedPool) else self.pool
        parts = {
            "pool": Path(pool).read_text() if pool != "default" and isinstance(pool, str) else pool,
            "method": method.model_dump(exclude={"name"}),
            "dataset": dataset.model_dump(exclude={"n", "label"}),
        }
        checkpoints = [_stamp(Path(v)) for v in method._parsed.model_dump().values() if _is_folder(v)]
        if checkpoints:
            parts["checkpoints"] = checkpoints
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _is_folder(value: Any) -> bool:
    return isinstance(value, str) and Path(value).is_dir()


def _stamp(folder: Path) -> str:
    """The digest of a checkpoint folder's contents (``program_digest``): a conductor retrained in place is a new
    method, and one copied, checked out again or saved again unchanged is not (file times change with each)."""
    stats = [(p, p.stat()) for p in folder.rglob("*") if p.is_file()]
    return _digest(folder, tuple(sorted((str(p), stat.st_size, stat.st_mtime_ns) for p, stat in stats)))


@functools.lru_cache(maxsize=64)
def _digest(folder: Path, files: tuple[tuple[str, int, int], ...]) -> str:
    """``program_digest``, read once per process while the folder's files keep their sizes and times (every unit of a
    run asks for it)."""
    return program_digest(folder)


def validate_config(data: Any, base_dir: str | Path = ".", source: str | Path | None = None) -> BenchConfig:
    """A ``BenchConfig`` from a parsed config; every problem in it is reported at once in one ``ConfigError``."""
    if not isinstance(data, dict):
        raise ConfigError("an experiment config must be a mapping with `datasets`, `methods` and `output`")
    try:
        config = BenchConfig.model_validate(data, context={"base_dir": Path(base_dir)})
    except pydantic.ValidationError as exc:
        count = exc.error_count()
        heading = f"invalid experiment config ({count} problem{'s' if count > 1 else ''})"
        raise invalid_config(heading, exc, model=BenchConfig) from None
    config._source = Path(source) if source is not None else None
    return config


def load_config(
    path: str | Path,
    *,
    n: int | None = None,
    threads: int | None = None,
    output: str | Path | None = None,
    ray: str | None = None,
) -> BenchConfig:
    """Read and validate a YAML config; ``n`` (every dataset), ``threads``, ``output`` and ``ray`` override its values
    (a relative ``output`` here is relative to the working folder, as on a command line)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"can't read experiment config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if isinstance(data, dict):
        if n is not None:
            data["datasets"] = [{**d, "n": n} if isinstance(d, dict) else d for d in data.get("datasets") or []]
        if threads is not None:
            data["threads"] = threads
        if output is not None:
            data["output"] = str(Path(output).absolute())
        if ray is not None:
            data["ray"] = ray
    return validate_config(data, base_dir=path.parent, source=path)
