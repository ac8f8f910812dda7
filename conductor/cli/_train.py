"""``conductor train CONFIG``: GRPO on the conductor policy over the config's train split; save the trained program.

The run's metrics, rollouts and checkpoints go to ``output_dir`` (see ``GRPOTrainer``), the program to
``output_dir/program`` (``conductor eval`` and ``conductor serve`` read it).
"""

from __future__ import annotations

import argparse

from conductor.cli._common import fail, status
from conductor.deploy import save_program
from conductor.errors import ConductorError, ConfigError

PROGRAM = "program"


def register(commands) -> None:
    parser = commands.add_parser("train", help="train the conductor with GRPO and save the program")
    parser.add_argument("config", metavar="CONFIG", help="a run config (YAML) with a `grpo` section")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
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
            trainset = config.splits().train
            policy = config.policy()
            program = config.conductor(policy)
        grammar = config.grammar(policy, grpo.max_new_tokens)
        GRPOTrainer(
            grpo, policy, program, trainset, config.metric, logits_processor=grammar, rollout_setup=config.rollout_setup
        ).run()
        folder = save_program(program, config.output_dir / PROGRAM)
    except ConductorError as exc:
        return fail(exc)
    status.print(f"Trained for {grpo.steps} steps; metrics in {config.output_dir}, program in {folder}")
    return 0
