"""``conductor train CONFIG``: GRPO on the conductor policy over the config's train split; save the trained program.

The run's metrics, rollouts and checkpoints go to ``output_dir`` (see ``GRPOTrainer``, whose bar shows the steps),
the program to ``output_dir/program`` (``conductor eval`` and ``conductor serve`` read it). Then the untrained and the
trained program are scored on the validation and test splits (``held_out.md``), and the workflows each wrote on the
test split are shown per kind of question.
"""

from __future__ import annotations

import argparse
from typing import Any

from conductor.cli._common import evaluation_progress, fail, status
from conductor.cli._eval import evaluate, fresh_program, held_out
from conductor.deploy import save_program
from conductor.errors import ConductorError, ConfigError

PROGRAM = "program"


def register(commands) -> None:
    parser = commands.add_parser("train", help="train the conductor with GRPO and save the program")
    parser.add_argument("config", metavar="CONFIG", help="a run config (YAML) with a `grpo` section")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    parser.add_argument(
        "--no-test",
        action="store_true",
        help="skip scoring the untrained and trained program on the validation and test splits",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from conductor.cli._config import load_run_config  # these import torch: only when the command runs
    from conductor.optimizers.grpo import GRPOTrainer

    try:
        config = load_run_config(args.config)
        if config.grpo is None:
            raise ConfigError(f"{args.config} has no `grpo` section: nothing to train")
        grpo = config.grpo.model_copy(update={"resume": args.resume})
        with status.status("Loading the data, the pool and the policy…"):
            splits = config.splits()
            policy = config.policy()
            program = config.conductor(policy)
        grammar = config.grammar(policy, grpo.max_new_tokens)
        GRPOTrainer(
            grpo,
            policy,
            program,
            splits.train,
            config.metric,
            logits_processor=grammar,
            rollout_setup=config.rollout_setup,
        ).run()
        folder = save_program(program, config.output_dir / PROGRAM)
        status.print(f"Trained for {grpo.steps} steps; metrics in {config.output_dir}, program in {folder}")
        if splits.test and not args.no_test:
            with evaluation_progress():
                compare(config, program, splits)
    except ConductorError as exc:
        return fail(exc)
    return 0


def compare(config: Any, trained: Any, splits: Any) -> None:
    """The untrained and the ``trained`` program's scores on the validation split (the training split when there is
    none, as ``compile`` does) and the test split, and the workflows each wrote there."""
    programs = {"untrained": fresh_program(config), "trained": trained}
    validation_set = splits.val or splits.train
    status.print(f"Scoring the untrained and the trained program on {len(validation_set)} validation questions…")
    validation = {
        name: evaluate(program, validation_set, config.metric, threads=1, ray=config.ray).summary()["accuracy"]
        for name, program in programs.items()
    }
    held_out(config, programs, validation, splits.test, threads=1, ray=config.ray)
