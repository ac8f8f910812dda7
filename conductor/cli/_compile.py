"""``conductor compile CONFIG``: the full recipe (``ConductorCompiler``) on the config's train and validation splits.

Program search, few-shot workflow search, expert iteration and GRPO when the config has their sections and a
trainable conductor, and Optuna budgets when ``compile.budget_trials`` > 0; then the phase table, and the uncompiled
and compiled program scored on the test split (``held_out.md``). Running it again with the same ``output_dir`` resumes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from conductor.cli._common import console, fail, status
from conductor.cli._eval import add_ray_argument
from conductor.errors import ConductorError
from conductor.optimizers import BudgetTuner, ConductorCompiler, WorkflowFewShot


def register(commands) -> None:
    parser = commands.add_parser("compile", help="prompt search, GRPO and budgets on a config; print the phase table")
    parser.add_argument("config", metavar="CONFIG", help="a run config (YAML)")
    parser.add_argument("--threads", type=int, default=1, help="questions evaluated at once (per Ray task)")
    add_ray_argument(parser)
    parser.add_argument(
        "--no-test", action="store_true", help="skip scoring the uncompiled and compiled program on the test split"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from conductor.cli._config import CompileSection, load_run_config  # imports torch: only when run

    try:
        config = load_run_config(args.config)
        ray = args.ray or config.ray
        spec = config.compile or CompileSection()
        with status.status("Loading the data, the pool and the conductor…"):
            splits = config.splits()
            policy = config.policy() if config.program.trainable else None
            student = config.conductor(policy)
        grpo = config.grpo if policy is not None else None
        expert = config.expert_iteration if policy is not None else None
        templates = config.template_warm_start if policy is not None else None
        search = config.search if policy is not None else None
        trained = grpo or expert  # the phases that sample from the policy, under the grammar if the program has one
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
            )
            if spec.few_shot
            else None,
            search=search,
            template_warm_start=templates,
            expert_iteration=expert,
            grpo=grpo,
            rounds=spec.rounds,
            budget_tuner=budget,
            max_cost=spec.max_cost,
            min_accuracy=spec.min_accuracy,
            logits_processor=config.grammar(policy, trained.max_new_tokens) if trained is not None else None,
            num_threads=args.threads,
            ray=ray,
            rollout_setup=config.rollout_setup,
            progress=True,
        )
        with status.status(f"Compiling into {config.output_dir} (phases run one after another)…"):
            best = compiler.compile(student, trainset=splits.train, valset=splits.val)
        console.print((config.output_dir / "phases.md").read_text(), markup=False, highlight=False)
        status.print(f"The best program is in {config.output_dir / 'best'}")
        if splits.test and not args.no_test:
            held_out(config, best, splits.test, threads=args.threads, ray=ray)
    except ConductorError as exc:
        return fail(exc)
    return 0


def held_out(config: Any, best: Any, test: list, *, threads: int, ray: str | None = None) -> None:
    """Score the program as the config builds it (uncompiled: a fresh policy, since GRPO trained the student's in
    place) and the compiled one on the test split, which no phase saw; write ``held_out.md`` and ``held_out.json``."""
    from conductor.cli._eval import evaluate

    with status.status(f"Scoring the uncompiled and the compiled program on {len(test)} held-out questions…"):
        uncompiled = config.conductor(config.policy() if config.program.trainable else None)
        rows = {
            "uncompiled": evaluate(uncompiled, test, config.metric, threads=threads, ray=ray),
            "compiled": evaluate(best, test, config.metric, threads=threads, ray=ray),
        }
    (config.output_dir / "held_out.json").write_text(json.dumps(rows, indent=2))
    families = sorted({f for r in rows.values() for f in r["by_family"]})
    lines = [
        "| program | test accuracy | n | "
        + "".join(f"{f} | " for f in families)
        + "tokens per question | $ per question | format-error rate |",
        "|---|---|---|" + "---|" * len(families) + "---|---|---|",
        *(
            f"| {name} | {r['accuracy']:.3f} | {r['n']} | "
            + "".join(f"{r['by_family'][f]['accuracy']:.3f} (n={r['by_family'][f]['n']}) | " for f in families)
            + f"{r['tokens_per_question']:.0f} | {r['cost_per_question']:.6f} | {r['format_error_rate']:.3f} |"
            for name, r in rows.items()
        ),
    ]
    (config.output_dir / "held_out.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines), markup=False, highlight=False)
