"""Issue 26: how peaked is a trained conductor, and at what temperature would its GRPO groups disagree?

For the first training questions of each family, a group of workflows sampled at each temperature, the conductor
alone (no worker is called): how many distinct workflows and worker choices a group holds, and the share of groups
with one workflow only. A group that samples one workflow every time gives GRPO no gradient whatever the workers
answer, so this measures what its rollouts' temperature must be before any worker runs. Written to ``diversity.md``
and ``diversity.json`` in ``--output`` (``results/default/``).

    python experiments/workflow_diversity.py   # the 10-family warm start (default_train.yaml), 3 questions a family
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

from conductor.cli import load_run_config
from conductor.conductor_lm import constraint_factory
from conductor.deploy import load_program
from conductor.local import trainable_policy

EXPERIMENTS = Path(__file__).resolve().parent
RESULTS = EXPERIMENTS / "results" / "default"
MAX_NEW_TOKENS = 192  # default_grpo.yaml's grpo.max_new_tokens


def groups(program: Any, questions: list[tuple[str, str]], size: int, temperature: float) -> list[dict[str, Any]]:
    """Per ``(family, question)``, ``size`` workflows sampled at ``temperature`` in one batch, as GRPO samples a
    group: under the program's workflow grammar, at most ``MAX_NEW_TOKENS`` long."""
    policy = trainable_policy(program.orchestrate.lm)
    grammar = constraint_factory(policy, MAX_NEW_TOKENS)(program)
    rows = []
    for index, (family, question) in enumerate(questions):
        samples = policy.sample(
            [program.prompt_messages(question)],
            size,
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=temperature,
            seed=index,
            logits_processor=grammar,
        )[0]
        replies = [program.read_completion(sample.text) for sample in samples]
        workers = [tuple(step.worker for step in r.workflow.steps) if r.workflow else None for r in replies]
        rows.append(
            {
                "family": family,
                "workflows": len({sample.text for sample in samples}),
                "worker_choices": len(set(workers)),
                "valid": sum(w is not None for w in workers),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", default=str(RESULTS / "trained" / "best"))
    parser.add_argument("--config", default=str(EXPERIMENTS / "configs" / "default_train.yaml"))
    parser.add_argument("--per-family", type=int, default=3)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0, 1.3])
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    program = load_program(args.program, trust_code=True)
    by_family: dict[str, list[str]] = defaultdict(list)
    for example in load_run_config(args.config).splits().train:
        if len(by_family[example.family]) < args.per_family:
            by_family[example.family].append(example.question)
    questions = [(family, q) for family, qs in sorted(by_family.items()) for q in qs]

    summary = {}
    for temperature in args.temperatures:
        rows = groups(program, questions, args.group, temperature)
        summary[str(temperature)] = {
            "groups": len(rows),
            "one_workflow": sum(r["workflows"] == 1 for r in rows),
            "one_worker_choice": sum(r["worker_choices"] == 1 for r in rows),
            "mean_workflows": round(mean(r["workflows"] for r in rows), 2),
            "valid_share": round(sum(r["valid"] for r in rows) / (len(rows) * args.group), 3),
            "rows": rows,
        }
        print(temperature, {k: v for k, v in summary[str(temperature)].items() if k != "rows"}, flush=True)
    program_path = Path(args.program).resolve()
    if program_path.is_relative_to(EXPERIMENTS.parent):
        program_path = program_path.relative_to(EXPERIMENTS.parent)  # the repository's own, named as the README does
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "diversity.json").write_text(json.dumps({"program": str(program_path), **summary}, indent=2) + "\n")
    lines = [
        f"Workflows sampled by `{program_path}`, {args.group} a question, on "
        f"{len(questions)} training questions ({args.per_family} of each family); no worker called.",
        "",
        "| temperature | groups with one workflow | with one choice of workers | distinct workflows a group | valid |",
        "|---|---|---|---|---|",
    ]
    for temperature, s in summary.items():
        lines.append(
            f"| {temperature} | {s['one_workflow']} of {s['groups']} | {s['one_worker_choice']} of {s['groups']} | "
            f"{s['mean_workflows']:.2f} | {100 * s['valid_share']:.0f}% |"
        )
    (args.output / "diversity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
