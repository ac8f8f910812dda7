"""``WorkerPool``: the ordered team of workers a conductor addresses by index, built in code or from a config.

Config (a dict, or a YAML / TOML file with the same shape)::

    show_descriptions: false          # workers appear to the conductor as "Model 0", "Model 1", ... (the paper)
    workers:
      - {name: smollm2, kind: local, model: smollm2-135m-instruct}
      - {name: gpt, kind: lm, model: openai/gpt-4o-mini, api_key_env: OPENAI_API_KEY,
         price: {input_per_1k: 0.00015, output_per_1k: 0.0006}, fallbacks: [smollm2]}
      - {name: python, kind: tool, tool: python}            # built-in tools: python, calculator, vote, check
      - {name: lookup, kind: tool, tool: "my_pkg.tools:lookup"}
      - {name: chat, kind: local, model: gemma-3-270m, framing: plain}   # the question alone when it is the step

Secrets never live in the config: an ``lm`` worker names the environment variable that holds its key.
``fallbacks`` names other workers of the pool that take a worker's steps while it fails (see ``_failover.py``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from conductor._imports import import_object
from conductor.errors import ConfigError, invalid_config
from conductor.modules.tools import CalculatorWorker, CheckWorker, PythonWorker, VoteWorker
from conductor.modules.workers import LMWorker, Price, ReplayStore, ReplayWorker, ToolWorker, Worker, as_worker
from conductor.modules.workflow import WorkerPromptAdapter

BUILTIN_TOOLS = ("python", "calculator", "vote", "check")


class PriceSpec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    input_per_1k: float = pydantic.Field(0.0, ge=0, allow_inf_nan=False, description="dollars per 1,000 prompt tokens")
    output_per_1k: float = pydantic.Field(
        0.0, ge=0, allow_inf_nan=False, description="dollars per 1,000 completion tokens"
    )


class WorkerSpec(pydantic.BaseModel):
    """One worker of a pool config. ``kind`` decides which of ``model`` / ``tool`` it needs."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(min_length=1, description="the worker's name, unique in the pool")
    kind: Literal["lm", "local", "tool"] = pydantic.Field(
        description="'lm': a litellm model; 'local': an embedded local model; 'tool': a tool (see `tool`)"
    )
    model: str | None = pydantic.Field(
        None, description="an 'lm' worker's litellm model string, or a 'local' worker's model name; needed by both"
    )
    tool: str | None = pydantic.Field(
        None, description=f"a 'tool' worker's tool: one of {BUILTIN_TOOLS} or 'module:function'"
    )
    description: str = pydantic.Field(
        "", description="what the worker does, shown to the conductor with `show_descriptions`; '': a built-in's own"
    )
    price: PriceSpec | None = pydantic.Field(
        None, description="what its tokens cost; None: free for tools and local models, litellm's price for 'lm'"
    )
    max_tokens: int = pydantic.Field(512, gt=0, description="the most tokens of one of its answers")
    temperature: float = pydantic.Field(0.2, ge=0, description="its sampling temperature")
    timeout_s: float = pydantic.Field(120.0, gt=0, description="seconds one call may take before it fails")
    retries: int = pydantic.Field(2, ge=0, description="retries of a failed call, with exponential backoff; 0: none")
    max_concurrency: int | None = pydantic.Field(
        None, gt=0, description="its calls in flight at once, across runs; None: no limit"
    )
    requests_per_minute: float | None = pydantic.Field(
        None, gt=0, description="its call starts per minute, evenly spaced; None: no limit"
    )
    cache: bool = pydantic.Field(
        False, description="'lm' workers: DSPy's cache answers a repeated identical call, at no cost (training)"
    )
    api_key_env: str | None = pydantic.Field(
        None, description="the environment variable holding an 'lm' worker's API key (keys are never in the file)"
    )
    api_base: str | None = pydantic.Field(
        None, description="an 'lm' worker's API base URL (e.g. a self-hosted server); None: litellm's default"
    )
    fallbacks: list[str] = pydantic.Field(
        [], description="other workers of the pool that take its steps while it fails, in order"
    )
    isolation: Literal["bwrap", "none"] = pydantic.Field(
        "bwrap", description="the python and check tools' sandbox: bubblewrap, or 'none', which runs code unisolated"
    )
    replay: bool = pydantic.Field(
        False,
        description="answer a prompt seen before with the same completion (experiments: methods share samples)",
    )
    framing: Literal[WorkerPromptAdapter.FRAMINGS] = pydantic.Field(  # type: ignore[valid-type]
        "task",
        description="models: 'task' words each step with the role's instructions, the task and the subtask; 'plain' "
        "sends a step that answers the whole question on its own the question alone (Worker.framing)",
    )

    @pydantic.model_validator(mode="after")
    def _kind_needs(self) -> WorkerSpec:
        if self.kind in ("lm", "local") and not self.model:
            raise ValueError(f"a {self.kind!r} worker needs `model`")
        if self.kind == "tool" and not self.tool:
            raise ValueError(f"a 'tool' worker needs `tool` (one of {BUILTIN_TOOLS} or 'module:function')")
        if self.kind == "tool" and self.tool not in BUILTIN_TOOLS and ":" not in self.tool:
            raise ValueError(f"unknown tool {self.tool!r}: use one of {BUILTIN_TOOLS} or 'module:function'")
        if self.isolation != "bwrap" and self.tool not in ("python", "check"):
            raise ValueError("`isolation` is an option of the tools that run code (python, check) only")
        if self.kind == "tool" and self.framing != "task":
            raise ValueError("`framing` is an option of models (kind lm or local): a tool reads its input as it is")
        return self


class PoolSpec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    workers: list[WorkerSpec] = pydantic.Field(
        min_length=1, description="the workers, in the order the conductor numbers them (Model 0, Model 1, ...)"
    )
    show_descriptions: bool = pydantic.Field(
        False, description="show the conductor each worker's description beside its id; false: ids only (the paper)"
    )

    @pydantic.model_validator(mode="after")
    def _unique_names(self) -> PoolSpec:
        names = [w.name for w in self.workers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"worker names must be unique; repeated: {duplicates}")
        problems = _fallback_problems(names, {w.name: w.fallbacks for w in self.workers})
        if problems:
            raise ValueError("; ".join(problems))
        return self


DEFAULT_POOL: dict[str, Any] = {
    "workers": [
        {"name": "smollm2", "kind": "local", "model": "smollm2-135m-instruct", "max_tokens": 256},
        {"name": "gemma", "kind": "local", "model": "gemma-3-270m", "max_tokens": 256},
        {"name": "python", "kind": "tool", "tool": "python"},
        {"name": "calculator", "kind": "tool", "tool": "calculator"},
    ]
}


class WorkerPool(Sequence[Worker]):
    """An ordered, immutable sequence of uniquely named workers. Index ``i`` is "Model i" to the conductor.

    ``workers`` may also hold a ``dspy.Tool``, any ``dspy.Module`` or a plain callable, each made a worker by
    ``as_worker``. ``fallbacks`` maps a worker's name to the names of the workers that take its steps while it fails,
    in order.
    """

    def __init__(
        self,
        workers: Sequence[Worker | Callable[[str], Any]],
        *,
        show_descriptions: bool = False,
        spec: PoolSpec | None = None,
        fallbacks: Mapping[str, Sequence[str]] | None = None,
    ):
        if not workers:
            raise ConfigError("a worker pool needs at least one worker")
        workers = [as_worker(worker) for worker in workers]
        names = [w.name for w in workers]
        if len(set(names)) != len(names):
            raise ConfigError(f"worker names must be unique: {names}")
        fallbacks = {name: tuple(others) for name, others in (fallbacks or {}).items() if others}
        problems = _fallback_problems(names, fallbacks)
        if problems:
            raise ConfigError("; ".join(problems))
        self._workers = tuple(workers)
        self.fallbacks = fallbacks
        self.show_descriptions = show_descriptions
        self.spec = spec  # the config it was built from, if any (saved with compiled programs; holds no secrets)

    # ---- building ------------------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: dict[str, Any] | PoolSpec, *, replay_store: ReplayStore | None = None) -> WorkerPool:
        """Build from a config dict; every problem in it is reported at once in one ``ConfigError``. Workers with
        ``replay`` keep their completions in ``replay_store`` when one is given (shared with other processes and
        runs), else in memory."""
        try:
            spec = config if isinstance(config, PoolSpec) else PoolSpec.model_validate(config)
        except pydantic.ValidationError as exc:
            raise invalid_config("invalid worker pool config", exc, "(pool)") from None
        return cls(
            [ReplayWorker(_build_worker(w), replay_store) if w.replay else _build_worker(w) for w in spec.workers],
            show_descriptions=spec.show_descriptions,
            spec=spec,
            fallbacks={w.name: w.fallbacks for w in spec.workers},
        )

    @classmethod
    def from_file(cls, path: str | Path, *, replay_store: ReplayStore | None = None) -> WorkerPool:
        """Build from a ``.yaml``/``.yml`` or ``.toml`` file (``replay_store`` as for ``from_config``)."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"can't read pool file {path}: {exc}") from exc
        try:
            config = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
        except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path} is not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {exc}") from exc
        if not isinstance(config, dict):
            raise ConfigError(f"{path} must hold a mapping with a `workers` list")
        return cls.from_config(config, replay_store=replay_store)

    @classmethod
    def default(cls) -> WorkerPool:
        """The embedded local pool: SmolLM2-135M-Instruct, Gemma-3-270M, a Python sandbox and a calculator."""
        return cls.from_config(DEFAULT_POOL)

    # ---- using ---------------------------------------------------------------------------------------------------
    def __getitem__(self, index):  # type: ignore[override]
        return self._workers[index]

    def __deepcopy__(self, memo: dict) -> WorkerPool:
        """Copies of a program share its pool: workers hold live resources (models, processes, locks, health)."""
        return self

    def __len__(self) -> int:
        return len(self._workers)

    def __iter__(self) -> Iterator[Worker]:
        return iter(self._workers)

    @property
    def names(self) -> list[str]:
        return [w.name for w in self._workers]

    def subset(self, indices: Sequence[int], *, fallback_to: Collection[str] | None = None) -> WorkerPool:
        """The workers at ``indices``, in that order (the conductor sees them as Model 0, 1, ...). They are the same
        objects, so they keep their resources and health. Fallbacks (and the config's, if any) are limited to the
        chosen workers, and to those named in ``fallback_to`` when it is given."""
        chosen = [self._workers[i] for i in indices]
        names = [worker.name for worker in chosen]
        reachable = set(names) if fallback_to is None else set(names) & set(fallback_to)
        fallbacks = {name: [other for other in self.fallbacks.get(name, ()) if other in reachable] for name in names}
        spec = self.spec
        if spec is not None:
            specs = {worker.name: worker for worker in spec.workers}
            workers = [specs[name].model_copy(update={"fallbacks": fallbacks[name]}) for name in names]
            spec = spec.model_copy(update={"workers": workers})
        return WorkerPool(chosen, show_descriptions=self.show_descriptions, spec=spec, fallbacks=fallbacks)

    def replayed(self, store: ReplayStore | None = None) -> WorkerPool:
        """This pool with each worker wrapped in a ``ReplayWorker``: programs run over it share its samples (a prompt
        sent twice gets the same completion), so what they score differently is their own doing. With ``store``, the
        samples are kept there too, and shared with other processes and later runs."""
        return WorkerPool(
            [ReplayWorker(worker, store) for worker in self],
            show_descriptions=self.show_descriptions,
            fallbacks=self.fallbacks,
        )

    @property
    def replay_store(self) -> ReplayStore | None:
        """The store its replay workers keep their completions in, if any. Raises ``ConfigError`` if they keep them
        in more than one."""
        stores = {w.store.path: w.store for w in self._workers if isinstance(w, ReplayWorker) and w.store is not None}
        if len(stores) > 1:
            raise ConfigError(f"the pool's replay workers keep their completions in {len(stores)} stores: use one")
        return next(iter(stores.values()), None)

    def framed(self, framings: Mapping[str, str]) -> WorkerPool:
        """This pool with the framing (``Worker.framing``) of the workers ``framings`` names set as it says. A worker
        whose framing changes is a copy that shares the original's model, limits and replayed answers; the others are
        the same objects. The config (if any) says the same, so a saved program keeps the framings. Raises
        ``ConfigError`` for a name the pool lacks, an unknown framing, or a tool given any framing but ``"task"``."""
        names = self.names
        problems = [
            f"no worker named {name!r} (the pool has {', '.join(names)})" for name in framings if name not in names
        ]
        problems += [
            f"worker {worker.name!r} is a tool: only a model can be called with the question alone (framing "
            f"{framings[worker.name]!r})"
            for worker in self
            if framings.get(worker.name, "task") != "task" and _is_tool(worker)
        ]
        if problems:
            raise ConfigError("; ".join(problems))
        changed = {name: framing for name, framing in framings.items() if self[names.index(name)].framing != framing}
        workers = [worker.with_framing(changed[worker.name]) if worker.name in changed else worker for worker in self]
        spec = self.spec
        if spec is not None and changed:
            specs = [w.model_copy(update={"framing": changed.get(w.name, w.framing)}) for w in spec.workers]
            spec = spec.model_copy(update={"workers": specs})
        return WorkerPool(workers, show_descriptions=self.show_descriptions, spec=spec, fallbacks=self.fallbacks)

    def describe(self, by_name: bool = False) -> str:
        """How the conductor sees the pool: ordinal ids (``Model 0``) or the workers' names, plus descriptions only
        when the pool opts in."""
        lines = []
        for i, worker in enumerate(self._workers):
            extra = f": {worker.description}" if self.show_descriptions and worker.description else ""
            lines.append(f"{worker.name if by_name else f'Model {i}'}{extra}")
        return "\n".join(lines)

    def close(self) -> None:
        for worker in self._workers:
            worker.close()

    def __repr__(self) -> str:
        return f"WorkerPool({self.names})"


def _is_tool(worker: Worker) -> bool:
    return isinstance(worker.worker if isinstance(worker, ReplayWorker) else worker, ToolWorker)


def _fallback_problems(names: Sequence[str], fallbacks: Mapping[str, Sequence[str]]) -> list[str]:
    """Every fallback that names no worker of the pool, or the worker itself."""
    problems = []
    for name, others in fallbacks.items():
        if name not in names:
            problems.append(f"fallbacks are given for {name!r}, which is not in the pool")
        problems += [f"{name!r} falls back to {o!r}, which is not in the pool" for o in others if o not in names]
        if name in others:
            problems.append(f"{name!r} can't fall back to itself")
    return problems


WorkerBuilder = Callable[[WorkerSpec, dict[str, Any]], Worker]
"""Builds a worker from its spec and the options every worker takes (price, max_tokens, temperature, ...)."""

_WORKER_KINDS: dict[str, WorkerBuilder] = {}


def register_worker_kind(kind: str, build: WorkerBuilder) -> None:
    """Make pool configs build workers of ``kind`` with ``build``: for kinds a higher layer implements (``local``
    models live in ``conductor.local``, which registers its kind when imported)."""
    _WORKER_KINDS[kind] = build


def _build_worker(spec: WorkerSpec) -> Worker:
    common = {
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "timeout_s": spec.timeout_s,
        "retries": spec.retries,
        "max_concurrency": spec.max_concurrency,
        "requests_per_minute": spec.requests_per_minute,
        "framing": spec.framing,
    }
    if spec.description:  # otherwise built-in workers keep their own description
        common["description"] = spec.description
    if spec.price is not None:  # otherwise each kind's own: free, or litellm's price for an API model
        common["price"] = Price(spec.price.input_per_1k, spec.price.output_per_1k)
    if spec.kind == "lm":
        return _api_worker(spec, common)
    if spec.kind == "tool":
        return _tool_worker(spec, common)
    build = _WORKER_KINDS.get(spec.kind)
    if build is None:
        raise ConfigError(
            f"worker {spec.name!r}: nothing builds workers of kind {spec.kind!r}; importing conductor (which imports "
            "conductor.local) registers the 'local' kind"
        )
    return build(spec, common)


def _api_worker(spec: WorkerSpec, common: dict[str, Any]) -> Worker:
    import dspy

    lm_kwargs: dict[str, Any] = {"cache": spec.cache, "num_retries": 0}  # the executor owns retries
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise ConfigError(f"worker {spec.name!r} reads its API key from ${spec.api_key_env}, which is not set")
        lm_kwargs["api_key"] = key
    if spec.api_base:
        lm_kwargs["api_base"] = spec.api_base
    return LMWorker(spec.name, dspy.LM(spec.model, **lm_kwargs), **common)


def _tool_worker(spec: WorkerSpec, common: dict[str, Any]) -> Worker:
    if spec.tool == "python":
        return PythonWorker(name=spec.name, isolation=spec.isolation, **common)
    if spec.tool == "calculator":
        return CalculatorWorker(name=spec.name, **common)
    if spec.tool == "vote":
        return VoteWorker(name=spec.name, **common)
    if spec.tool == "check":
        return CheckWorker(name=spec.name, isolation=spec.isolation, **common)
    return ToolWorker(spec.name, _import_callable(spec.tool), **common)


def _import_callable(path: str) -> Callable[[str], Any]:
    fn = import_object(path, "tool ")
    if not callable(fn):
        raise ConfigError(f"tool {path!r} is not callable")
    return fn
