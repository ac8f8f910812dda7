"""The config file of ``conductor train``, ``eval`` and ``compile``: what program, on what data, trained how.

Components are named by import path (``module:function``, as torchtune names them; e.g.
``conductor.bench.datasets:load_gsm8k``), resolved against the working folder too, so a module of one's own works
from its folder. Paths (``program.pool``, a ``program.conductor`` folder, ``data.file.path``, ``output_dir``) are
relative to the config file, so a config means the same files from any folder. Every problem in a file is reported at
once, in one ``ConfigError``.

One's own data is a local file instead of a loader::

    data:
      file: {path: questions.jsonl, inputs: [question], answer: answer}   # or .csv, .parquet
      metric: number            # exact (default), contains, number, choice (needs file.options), module:function
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dspy
import pydantic
import yaml

from conductor._files import ConfigPath, config_folder_or_name, config_relative
from conductor._imports import import_object as imported
from conductor.bench.datasets import BUILTIN_METRICS, DataFile, MetricName, Splits, split
from conductor.deploy import conductor_lm, conductor_policy, is_trainable
from conductor.errors import ConfigError, invalid_config
from conductor.local import EMBEDDED_MODELS
from conductor.modules import Conductor, ReplayStore, WorkerIds, WorkerPool
from conductor.optimizers import BudgetSpace, ExpertIterationConfig, ProgramSearchConfig, TemplateWarmStartConfig
from conductor.optimizers.grpo import GRPOConfig

if TYPE_CHECKING:
    from conductor.conductor_lm import ConductorLM
    from conductor.optimizers.grpo import RolloutSetup


class LoraSection(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    r: int = pydantic.Field(16, ge=1, description="the LoRA adapter's rank")
    alpha: int = pydantic.Field(32, ge=1, description="LoRA's scale: the adapter's update is multiplied by alpha / r")


class ProgramSection(pydantic.BaseModel):
    """The program: a pool and a conductor, named as ``conductor.deploy.conductor_lm`` reads names. A trainable
    conductor is ``tiny``, ``local/<name>`` or a model folder; a litellm model string gets prompt search and budgets,
    no GRPO."""

    model_config = pydantic.ConfigDict(extra="forbid")
    pool: str = pydantic.Field("default", description="'default' (the embedded local pool) or a pool file")
    conductor: str = pydantic.Field(
        "local/smollm2-135m-instruct",
        description="the conductor LM: 'tiny', 'local/<name>' or a model folder (trainable), or a litellm model string",
    )
    max_steps: int = pydantic.Field(5, ge=1, description="the most steps a workflow may have")
    max_depth: int = pydantic.Field(0, ge=0, description="recursive rounds the conductor may add")
    worker_ids: WorkerIds = pydantic.Field(
        "numbers", description="'numbers' (Model 2, the paper's) or 'names': how workflows name workers"
    )
    max_tokens: int = pydantic.Field(384, ge=1, description="the conductor's longest workflow outside training")
    lora: LoraSection = pydantic.Field(LoraSection(), description="the LoRA adapter a trainable conductor trains")
    grammar: bool = pydantic.Field(
        False, description="decode only valid workflows, in training and after (needs xgrammar)"
    )
    replay_store: ConfigPath | None = pydantic.Field(
        None,
        description="a file where the pool's `replay` workers keep their completions, shared by every process of a "
        "run (its scoring on Ray, GRPO's rollout actors) and by other runs that name it, so that phases and compiles "
        "score on the same worker samples (as a bench config's `replay_store`); None: each process its own",
    )

    @pydantic.field_validator("pool")
    @classmethod
    def _pool_file(cls, pool: str, info: pydantic.ValidationInfo) -> str:
        if pool == "default":  # a name, not a path
            return pool
        path = config_relative(pool, info)
        if not path.is_file():
            raise ValueError(f"the pool file {path} does not exist (name one relative to the config, or 'default')")
        return str(path)

    @pydantic.model_validator(mode="after")
    def _store_needs_a_pool_file(self) -> ProgramSection:
        if self.replay_store is not None and self.pool == "default":
            raise ValueError(
                "replay_store needs a pool file whose workers say `replay: true` (the default pool's don't)"
            )
        return self

    @pydantic.field_validator("conductor")
    @classmethod
    def _model_name(cls, name: str, info: pydantic.ValidationInfo) -> str:
        if name in EMBEDDED_MODELS:
            raise ValueError(f"an embedded local model is named local/{name}")
        return config_folder_or_name(name, info)

    @property
    def trainable(self) -> bool:
        return is_trainable(self.conductor)

    def options(self) -> dict[str, Any]:
        """The ``Conductor`` options this section sets."""
        return {"max_steps": self.max_steps, "max_depth": self.max_depth, "worker_ids": self.worker_ids}


class DataSection(pydantic.BaseModel):
    """Where the examples come from (a ``loader`` function, or a local ``file``), how they are scored and how they
    are split into train, validation and test."""

    model_config = pydantic.ConfigDict(extra="forbid")
    loader: str | None = pydantic.Field(
        None, pattern=r"^[\w.]+:[\w.]+$", description="'module:function' returning dspy.Examples"
    )
    args: dict[str, Any] = pydantic.Field({}, description="keyword arguments of `loader` (a `file` takes none)")
    file: DataFile | None = pydantic.Field(None, description="a JSONL, CSV or Parquet file of questions and answers")
    metric: MetricName = pydantic.Field(
        "exact", description=f"one of {list(BUILTIN_METRICS)}, or 'module:function'(example, prediction)"
    )
    n: int | None = pydantic.Field(None, ge=1, description="use only the first n examples")
    seed: int = pydantic.Field(0, description="the seed that shuffles the examples before they are split")
    fractions: tuple[float, float, float] = pydantic.Field(
        (0.6, 0.2, 0.2), description="the shares of train, validation and test, summing to at most 1 (the rest unused)"
    )

    @pydantic.field_validator("fractions")
    @classmethod
    def _fractions(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if min(value) < 0 or sum(value) > 1 + 1e-9:
            raise ValueError(f"must be three non-negative numbers summing to at most 1, not {value}")
        return value

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> DataSection:
        if (self.loader is None) == (self.file is None):
            raise ValueError("name either a `loader` or a `file`")
        if self.file is not None and self.args:
            raise ValueError("`args` are a loader's; a file takes `inputs`, `answer` and `options`")
        return self

    def examples(self) -> list[dspy.Example]:
        """The loader's or the file's examples (the first ``n``); a file's unusable rows are logged and left out."""
        if self.file is not None:
            examples = self.file.read(self.metric).examples
        else:
            loader = import_object(self.loader)
            try:
                examples = list(loader(**self.args))
            except Exception as exc:  # the user's code called with the config's args: report it, don't crash
                raise ConfigError(f"data.loader {self.loader}(**args) failed: {type(exc).__name__}: {exc}") from exc
            if not examples:
                raise ConfigError(f"data.loader {self.loader} returned no examples")
        return examples[: self.n]


class CompileSection(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    rounds: int = pydantic.Field(1, ge=1, description="how many times prompt search and GRPO alternate")
    few_shot: int = pydantic.Field(4, ge=0, description="the most few-shot workflows (k); 0: no prompt phase")
    candidates: int = pydantic.Field(8, ge=0, description="random few-shot sets tried")
    budget_trials: int = pydantic.Field(0, ge=0, description="Optuna budget trials; 0: no budget phase")
    budget_space: BudgetSpace = pydantic.Field(BudgetSpace(), description="what the budget trials search")
    cost_unit: Literal["usd", "tokens"] = pydantic.Field("usd", description="the cost the budget phase trades off")
    max_cost: float | None = pydantic.Field(None, gt=0, description="the budget point's most cost per question")
    min_accuracy: float | None = pydantic.Field(None, ge=0, le=1, description="the budget point's least accuracy")
    optuna_storage: str | None = pydantic.Field(
        None,
        min_length=1,
        description="the Optuna storage URL of the budget trials (postgresql://...: machines share one study); "
        "None: output_dir/budget.db",
    )


class RunConfig(pydantic.BaseModel):
    """One config file; ``grpo`` takes ``GRPOConfig``'s fields, its ``output_dir`` being this one's."""

    model_config = pydantic.ConfigDict(extra="forbid")
    program: ProgramSection = pydantic.Field(ProgramSection(), description="the pool and the conductor")
    data: DataSection = pydantic.Field(description="the examples, the metric that scores them and their split")
    search: ProgramSearchConfig | None = pydantic.Field(
        None, description="program search: candidate workflows scored on the train split, the winners taught"
    )
    template_warm_start: TemplateWarmStartConfig | None = pydantic.Field(
        None, description="a fine-tune on hand-written workflows per label (trainable conductor); None: none"
    )
    expert_iteration: ExpertIterationConfig | None = pydantic.Field(
        None, description="sample workflows, fine-tune on those that scored (trainable conductor); None: none"
    )
    grpo: GRPOConfig | None = pydantic.Field(
        None, description="GRPO training of the conductor (`train`, `compile`); None: none (`train` needs it)"
    )
    compile: CompileSection | None = pydantic.Field(
        None, description="the rounds and phases of `conductor compile`; None: CompileSection's defaults"
    )
    output_dir: ConfigPath = pydantic.Field(
        description="the folder for metrics, checkpoints and the trained program (relative to the config file)"
    )
    ray: str | None = pydantic.Field(
        None, min_length=1, description="score (eval, compile) on the Ray cluster at this address; None: here"
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _grpo_output_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("grpo"), dict):
            # A stand-in that `_grpo_writes_to_output_dir` replaces: a missing output_dir is reported once, at the
            # top level, not again under grpo.
            data = {**data, "grpo": {**data["grpo"], "output_dir": "."}}
        return data

    @pydantic.model_validator(mode="after")
    def _grpo_writes_to_output_dir(self) -> RunConfig:
        if self.grpo is not None:
            self.grpo = self.grpo.model_copy(update={"output_dir": self.output_dir})
        return self

    @pydantic.model_validator(mode="after")
    def _one_workflow_length(self) -> RunConfig:
        # Both phases sample under one grammar, sized for one length: a shorter phase would cut its workflows.
        expert, grpo = self.expert_iteration, self.grpo
        if expert is not None and grpo is not None and expert.max_new_tokens != grpo.max_new_tokens:
            raise ValueError(
                f"expert_iteration.max_new_tokens ({expert.max_new_tokens}) and grpo.max_new_tokens "
                f"({grpo.max_new_tokens}) must be equal: both phases sample under one workflow grammar"
            )
        return self

    # ---- building what the config names ----------------------------------------------------------------------------
    @cached_property
    def metric(self) -> Callable[..., Any]:
        return BUILTIN_METRICS.get(self.data.metric) or import_object(self.data.metric)

    def pool(self) -> WorkerPool:
        spec = self.program
        if spec.pool == "default":
            return WorkerPool.default()
        store = None if spec.replay_store is None else ReplayStore(spec.replay_store)
        return WorkerPool.from_file(spec.pool, replay_store=store)

    def policy(self) -> ConductorLM:
        """The trainable conductor policy, LoRA adapter included."""
        from conductor.conductor_lm import LoraSpec

        spec = self.program
        try:
            return conductor_policy(spec.conductor, LoraSpec(r=spec.lora.r, alpha=spec.lora.alpha))
        except ConfigError as exc:
            raise ConfigError(f"program.conductor: {exc}") from None

    def conductor(self, policy: ConductorLM | None = None) -> Conductor:
        """The program: the pool, with ``policy`` (else the config's litellm conductor) writing the workflows."""
        spec = self.program
        if policy is None:
            lm = conductor_lm(spec.conductor, max_tokens=spec.max_tokens)
            return Conductor(self.pool(), lm, **spec.options())
        lm = policy.as_dspy_lm(max_tokens=spec.max_tokens)
        program = Conductor(self.pool(), lm, **spec.options())
        if spec.grammar:
            from conductor.conductor_lm import constrain_program

            constrain_program(program)  # evaluated and saved as it is trained: under the grammar
        return program

    def grammar(self, policy: ConductorLM, max_new_tokens: int) -> Callable[[Conductor, int], Any] | None:
        """The workflow grammar per pool and round (a ``ProcessorFactory``) when ``program.grammar`` asks for it."""
        if not self.program.grammar:
            return None
        from conductor.conductor_lm import constraint_factory

        return constraint_factory(policy, max_new_tokens)

    def rollout_setup(self) -> RolloutSetup:
        """What each GRPO rollout actor on Ray builds from this config (``GRPOTrainer``'s ``rollout_setup``)."""
        from conductor.optimizers.grpo import RolloutSetup

        policy = self.policy()
        max_new_tokens = self.grpo.max_new_tokens if self.grpo is not None else self.program.max_tokens
        return RolloutSetup(policy, self.conductor(policy), self.metric, self.grammar(policy, max_new_tokens))

    def splits(self) -> Splits:
        """The data's examples (the first ``n``), split by ``seed`` and ``fractions``."""
        return split(self.data.examples(), self.data.seed, self.data.fractions)


def load_run_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML config file, its paths relative to its folder; every problem in one ``ConfigError``."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"can't read config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping with `data` and `output_dir`")
    try:
        return RunConfig.model_validate(raw, context={"base_dir": path.parent})
    except pydantic.ValidationError as exc:
        raise invalid_config(f"invalid config {path}", exc, model=RunConfig) from None


def import_object(path: str) -> Any:
    """The object at ``module:qualname``, importable from the working folder too (as with ``python -m``)."""
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.append(str(Path.cwd()))
    return imported(path)
