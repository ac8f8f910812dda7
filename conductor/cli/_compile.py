"""``conductor compile CONFIG``: the full recipe (``ConductorCompiler``) on the config's train and validation splits.

Program search, few-shot workflow search, expert iteration and GRPO when the config has their sections and a
trainable conductor, and Optuna budgets when ``compile.budget_trials`` > 0; then the phase table, the uncompiled and
compiled program's validation and test scores (``held_out.md``), the workflows each wrote per kind of question, and
every phase against the program it started from, question by question on validation and on test (``paired.md``: on
test over one pool of shared worker samples). A bar with an ETA shows each phase's scoring (and program search and
GRPO their own). Running it again with the same ``output_dir`` resumes. ``--reward-cost``, ``--reward-tokens`` and
``--reward-steps`` set the GRPO reward's penalties over the config's ``grpo.reward``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conductor.cli._common import console, evaluation_progress, fail, status
from conductor.cli._eval import add_ray_argument, fresh_program, held_out
from conductor.errors import ConductorError
from conductor.optimizers import BudgetTuner, ConductorCompiler, WorkflowFewShot


def register(commands) -> None:
    parser = commands.add_parser("compile", help="prompt search, GRPO and budgets on a config; print the phase table")
    parser.add_argument("config", metavar="CONFIG", help="a run config (YAML)")
    parser.add_argument("--threads", type=int, default=1, help="questions evaluated at once (per Ray task)")
    add_ray_argument(parser)
    parser.add_argument(
        "--no-test",
        action="store_true",
        help="skip scoring the uncompiled and compiled program, and every phase's, on the test split",
    )
    for flag, field, what in REWARD_FLAGS:
        parser.add_argument(
            flag,
            dest=field,
            type=non_negative,
            metavar="WEIGHT",
            help=f"GRPO's reward loses WEIGHT {what}, so that of two equally right workflows the cheaper earns more "
            f"(default: the config's grpo.reward.{field}, else 0)",
        )
    parser.add_argument(
        "--optuna-storage",
        metavar="URL",
        help="the budget trials' Optuna storage, shared by machines running the same config (postgresql://...); "
        "default: the config's compile.optuna_storage, else output_dir/budget.db",
    )
    parser.set_defaults(handler=handle)


REWARD_FLAGS = (
    ("--reward-cost", "cost_penalty", "per dollar the workers spent"),
    ("--reward-tokens", "token_penalty", "per 1,000 tokens of the run"),
    ("--reward-steps", "step_penalty", "per step run"),
)
"""The flags that set the GRPO reward's penalties (``RewardConfig``'s fields)."""


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def handle(args: argparse.Namespace) -> int:
    from conductor.cli._config import load_run_config  # imports torch: only when run

    try:
        config = with_reward_weights(load_run_config(args.config), args)
        with status.status("Loading the data, the pool and the conductor…"):
            splits = config.splits()
            policy = config.policy() if config.program.trainable else None
            student = config.conductor(policy)
        compiler = build_compiler(
            config, policy, threads=args.threads, ray=args.ray or config.ray, optuna_storage=args.optuna_storage
        )
        status.print(f"Compiling into {config.output_dir} (phases run one after another)…")
        with evaluation_progress():
            best = compiler.compile(student, trainset=splits.train, valset=splits.val)
            console.print((config.output_dir / "phases.md").read_text(), markup=False, highlight=False)
            status.print(f"The best program is in {config.output_dir / 'best'}")
            if splits.test and not args.no_test:
                programs = {"uncompiled": fresh_program(config), "compiled": best}
                validation = validation_scores(config.output_dir)
                held_out(config, programs, validation, splits.test, threads=args.threads, ray=compiler.ray)
                status.print(f"Scoring every phase's program on the {len(splits.test)} test questions, samples shared…")
                compiler.score_phases(splits.test)
        console.print("\n" + (config.output_dir / "paired.md").read_text(), markup=False, highlight=False)
    except ConductorError as exc:
        return fail(exc)
    return 0


def with_reward_weights(config: Any, args: argparse.Namespace) -> Any:
    """``config`` with the GRPO reward's penalties the flags set; a flag without a ``grpo`` section is an error."""
    weights = {field: getattr(args, field) for _, field, _ in REWARD_FLAGS if getattr(args, field) is not None}
    if not weights:
        return config
    if config.grpo is None:
        raise ConductorError(
            f"GRPO's reward weights were given ({', '.join(f for f, field, _ in REWARD_FLAGS if field in weights)}), "
            f"but {args.config} has no `grpo` section: add one (e.g. `grpo: {{steps: 100}}`) or leave them out"
        )
    reward = config.grpo.reward.model_copy(update=weights)
    config.grpo = config.grpo.model_copy(update={"reward": reward})
    return config


def build_compiler(
    config: Any, policy: Any, *, threads: int, ray: str | None, optuna_storage: str | None = None
) -> ConductorCompiler:
    """The config's phases: those that train weights only with a trainable conductor (``policy``); the budget trials
    in ``optuna_storage``, else the config's, else ``output_dir/budget.db``."""
    from conductor.cli._config import CompileSection  # imports torch: only when run

    spec = config.compile or CompileSection()
    grpo = config.grpo if policy is not None else None
    expert = config.expert_iteration if policy is not None else None
    trained = grpo or expert  # the phases that sample from the policy, under the grammar if the program has one
    budget = None
    if spec.budget_trials:
        storage = optuna_storage or spec.optuna_storage or f"sqlite:///{(config.output_dir / 'budget.db').absolute()}"
        budget = BudgetTuner(
            config.metric,
            space=spec.budget_space,
            n_trials=spec.budget_trials,
            storage=storage,
            cost_unit=spec.cost_unit,
            num_threads=threads,
        )
    return ConductorCompiler(
        config.metric,
        output_dir=config.output_dir,
        prompt_search=WorkflowFewShot(
            config.metric, k=spec.few_shot, num_candidates=spec.candidates, num_threads=threads
        )
        if spec.few_shot
        else None,
        search=config.search if policy is not None else None,
        template_warm_start=config.template_warm_start if policy is not None else None,
        expert_iteration=expert,
        grpo=grpo,
        rounds=spec.rounds,
        budget_tuner=budget,
        max_cost=spec.max_cost,
        min_accuracy=spec.min_accuracy,
        logits_processor=config.grammar(policy, trained.max_new_tokens) if trained is not None else None,
        num_threads=threads,
        ray=ray,
        rollout_setup=config.rollout_setup,
        progress=True,
    )


def validation_scores(output_dir: Path) -> dict[str, float]:
    """The uncompiled (start) and compiled (best kept) program's validation accuracy, from the phase table."""
    records = json.loads((output_dir / "phases.json").read_text())
    best = [record for record in records if record["kept"]][-1]
    return {"uncompiled": records[0]["score"] / 100, "compiled": best["score"] / 100}
