"""Your own workers in one pool: a plain Python function, a ``dspy.Tool`` and a model that answers in a role of your
own (a ``dspy.Signature``), with one question run through them.

- ``count_words`` is a function: its step's subtask is its one argument.
- ``convert`` is a ``dspy.Tool`` of two arguments: the conductor writes its subtask as a JSON object naming them.
- ``writer`` is a model; a step may give it the custom role ``Report`` (any signature whose inputs are some of
  ``question``, ``context`` and ``subtask`` and which has one output field).

The conductor and the writer are scripted stand-ins by default (``conductor.testing``), so this runs offline in
seconds: the conductor always writes the workflow in ``STAND_IN_WORKFLOW`` and the writer repeats what the earlier
steps found. Point them at real models with ``--conductor`` (a litellm model, its key in the environment) and
``--writer`` (a litellm model, or ``local/smollm2-135m-instruct`` for the embedded one)::

    python examples/custom_workers.py
    python examples/custom_workers.py --conductor openai/gpt-4o-mini --writer openai/gpt-4o-mini
"""

from __future__ import annotations

import argparse
import itertools

import dspy

from conductor import Conductor, LMWorker, Worker, WorkerPool
from conductor.signatures import BUILTIN_ROLES
from conductor.testing import ScriptedWorker, scripted_lm

QUESTION = "How many words are in 'the quick brown fox jumps over the lazy dog', and how far is 26.2 miles in km?"

# What the stand-in conductor writes: workers by name (worker_ids="names"), the writer in the custom role.
STAND_IN_WORKFLOW = """\
model_id = ["count_words", "convert", "writer"]
subtasks = ["the quick brown fox jumps over the lazy dog", "{\\"value\\": 26.2, \\"unit\\": \\"mi\\"}", \
"Report both results in one sentence."]
access_list = [[], [], "all"]
roles = ["", "", "report"]"""


class Report(dspy.Signature):
    """Report what the earlier steps found, in one sentence that answers the overall question."""

    question: str = dspy.InputField(desc="the overall question")
    context: str = dspy.InputField(desc="the earlier steps and their results")
    subtask: str = dspy.InputField()
    report: str = dspy.OutputField()


def count_words(text: str) -> int:
    """Counts the words in a text."""
    return len(text.split())


def convert(value: float, unit: str) -> str:
    """Converts a distance in miles ('mi') or feet ('ft') to kilometres."""
    per_unit = {"mi": 1.609344, "ft": 0.0003048}
    if unit not in per_unit:
        raise ValueError(f"unknown unit {unit!r}: use one of {sorted(per_unit)}")
    return f"{value * per_unit[unit]:.2f} km"


def stand_in_writer(prompt: str) -> str:
    """Stands in for a model: reports each earlier step's response (the line after its "response:" line)."""
    lines = prompt.splitlines()
    found = [answer for label, answer in itertools.pairwise(lines) if label.endswith("response:")]
    return "Report: " + "; ".join(found)


def writer(model: str | None) -> Worker:
    if model is None:
        return ScriptedWorker("writer", stand_in_writer, description="writes reports (a scripted stand-in)")
    if model.startswith("local/"):
        from conductor.local import local_worker  # torch and transformers: only for a local model

        return local_worker(model.removeprefix("local/"), name="writer", description="writes reports")
    return LMWorker("writer", dspy.LM(model), description="writes reports")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--conductor", help="a litellm model (default: a stand-in that writes STAND_IN_WORKFLOW)")
    parser.add_argument("--writer", help="a litellm model or local/<name> (default: a scripted stand-in)")
    args = parser.parse_args()

    pool = WorkerPool([count_words, dspy.Tool(convert), writer(args.writer)], show_descriptions=True)
    lm = dspy.LM(args.conductor) if args.conductor else scripted_lm(lambda _: STAND_IN_WORKFLOW)
    program = Conductor(pool, lm, roles=[*BUILTIN_ROLES, Report], worker_ids="names", max_steps=4)
    prediction = program(question=args.question)

    for step in prediction.trace:
        print(f"step {step.index}: {step.worker} ({step.role}) <- {step.subtask!r}")
        print(f"    -> {step.output if step.error is None else 'failed: ' + step.error}")
    print(f"Answer: {prediction.answer}")
    if prediction.error is not None:
        print(f"Error: {prediction.error}")


if __name__ == "__main__":
    main()
