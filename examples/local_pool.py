"""The embedded local pool from Python: SmolLM2-135M, Gemma-3-270M, a sandboxed Python runner and a calculator, all
in this process, no API key and no network. Answers one question and prints the workflow the conductor wrote, each
step with its tokens, cost and time, and the run's totals.

    python examples/local_pool.py "What is 17 * 23 + 4?"
    python examples/local_pool.py "Who wrote Hamlet?" --conductor local/smollm2-135m-instruct

By default the conductor is the trained one that ships with the package (``conductor run``'s default: SmolLM2-135M
with a LoRA adapter that learned to send arithmetic to the calculator). ``--conductor`` builds a fresh, untrained one
instead, named as ``conductor run --conductor`` names it: ``local/<name>`` (decoding under the workflow grammar), a
checkpoint folder, or a litellm model such as ``openai/gpt-4o-mini`` (its key in the environment). The first run
converts the embedded models to a cache (about 25 s for SmolLM2); later runs load them in seconds.
"""

from __future__ import annotations

import argparse

import conductor
from conductor import Conductor, WorkerPool
from conductor.deploy import TRAINED_PROGRAM, conductor_lm, is_trainable


def build_program(conductor_name: str | None) -> Conductor:
    if conductor_name is None:
        return conductor.load(TRAINED_PROGRAM)  # a saved program: the embedded pool, its trained conductor, its limits
    program = Conductor(WorkerPool.default(), conductor_lm(conductor_name, max_tokens=384), max_steps=3)
    if is_trainable(conductor_name):  # a local model: it writes valid workflows only under the grammar
        from conductor.conductor_lm import constrain_program  # torch: only for a local conductor

        constrain_program(program)
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question")
    parser.add_argument("--conductor", help="a fresh conductor LM (default: the shipped trained conductor)")
    args = parser.parse_args()

    program = build_program(args.conductor)
    print("Pool:", ", ".join(program.pool.names))
    prediction = program(question=args.question)

    names = program.pool.names
    print("Workflow:")
    print(prediction.workflow.to_text(names) if prediction.workflow else f"none ({prediction.error})")
    for step in prediction.trace:
        print(
            f"step {step.index} · {step.answered_by or step.worker} · {step.role} · sees {list(step.visible)} · "
            f"{step.prompt_tokens}+{step.completion_tokens} tokens · ${step.cost:.6f} · {step.latency_s:.2f} s"
        )
        print(f"    subtask: {step.subtask}")
        print(f"    {step.output if step.error is None else 'failed: ' + step.error}")
    print(f"Answer: {prediction.answer}")
    conductor_tokens = prediction.conductor_usage.tokens
    print(f"Total: {prediction.tokens} tokens ({conductor_tokens} the conductor's) · ${prediction.cost:.6f}")
    if prediction.error is not None:
        print(f"Error: {prediction.error}")


if __name__ == "__main__":
    main()
