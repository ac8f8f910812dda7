"""``conductor compile CONFIG``: the full recipe (``ConductorCompiler``) on the config's train and validation splits.

Few-shot workflow search, GRPO when the config has a ``grpo`` section and a trainable conductor, and Optuna budgets
when ``compile.budget_trials`` > 0; then the phase table. Running it again with the same ``output_dir`` resumes.
"""

from __future__ import annotations

import argparse

from conductor.cli._common import console, fail, status
from conductor.errors import ConductorError
from conductor.optimizers import BudgetTuner, ConductorCompiler, WorkflowFewShot


def register(commands) -> None:
    parser = commands.add_parser("compile", help="prompt search, GRPO and budgets on a config; print the phase table")
    parser.add_argument("config", metavar="CONFIG", help="a run config (YAML)")
    parser.add_argument("--threads", type=int, default=1, help="questions evaluated at once")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from conductor.cli._config import CompileSection, load_run_config  # imports torch: only when run

    try:
        config = load_run_config(args.config)
        spec = config.compile or CompileSection()
        with status.status("Loading the data, the pool and the conductor…"):
            splits = config.splits()
            policy = config.policy() if config.program.trainable else None
            student = config.conductor(policy)
        grpo = config.grpo if policy is not None else None
        budget = None
        if spec.budget_trials:
            storage = f"sqlite:///{(config.output_dir / 'budget.db').absolute()}"
            budget = BudgetTuner(
                config.metric,
                space=spec.budget_space,
                n_trials=spec.budget_trials,
                storage=storage,
                cost_unit=spec.cost_unit,
                num_threads=args.threads,
            )
        compiler = ConductorCompiler(
            config.metric,
            output_dir=config.output_dir,
            prompt_search=WorkflowFewShot(
                config.metric, k=spec.few_shot, num_candidates=spec.candidates, num_threads=args.threads
            ),
            grpo=grpo,
            rounds=spec.rounds,
            budget_tuner=budget,
            max_cost=spec.max_cost,
            min_accuracy=spec.min_accuracy,
            logits_processor=config.grammar(policy, grpo.max_new_tokens) if grpo is not None else None,
            num_threads=args.threads,
        )
        with status.status(f"Compiling into {config.output_dir} (phases run one after another)…"):
            compiler.compile(student, trainset=splits.train, valset=splits.val)
    except ConductorError as exc:
        return fail(exc)
    console.print((config.output_dir / "phases.md").read_text(), markup=False, highlight=False)
    status.print(f"The best program is in {config.output_dir / 'best'}")
    return 0
