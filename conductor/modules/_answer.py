"""Turn the last step's response into the value of the user's output field."""

from __future__ import annotations

import re
from typing import Any

_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:final\s+)?answer(?:\*\*)?\s*[:=]\s*(?P<answer>.+?)\s*$", re.I | re.M)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def extract_answer(text: str, annotation: Any = str) -> Any:
    """The answer in ``text``: what follows its last "Answer:" line if it has one (the roles ask for it), else the
    whole text, converted to ``annotation`` (``int``/``float`` take the last number, ``bool`` a yes/no).
    Returns the text itself when conversion is impossible, so nothing the worker said is lost."""
    lines = _ANSWER_LINE.findall(text)
    answer = lines[-1].strip() if lines else text.strip()
    if annotation in (int, float):
        numbers = _NUMBER.findall(answer) or _NUMBER.findall(text)
        if not numbers:
            return answer
        value = float(numbers[-1].replace(",", ""))
        return int(value) if annotation is int and value.is_integer() else value
    if annotation is bool:
        word = answer.lower().strip(" .!")
        return True if word.startswith(("yes", "true")) else False if word.startswith(("no", "false")) else answer
    return answer
