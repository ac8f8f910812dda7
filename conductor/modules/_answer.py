"""Read answers out of responses: the value of the user's output field, and which lettered option a reply picks
(shared by the benchmark metrics and the checker tool)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_ANSWER_LINE = re.compile(
    r"^\s*(?:\*\*)?(?:final\s+)?answer(?:\*\*)?\s*[:=](?P<gap>\s*)(?P<answer>.+?)\s*$", re.I | re.M
)
_SPACES = re.compile(r"\s+")
_DECORATION = "*_`'\" \t\n"
_BULLET = re.compile(r"^\s*[-*•]\s+")
_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\(?(?:[A-Z]|\d{1,2})[.):\]])\s+\S")  # "- Yes", "(B) No", "2. text"
_STATED = re.compile(r"\banswer\s+is\b", re.I)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def extract_answer(text: str, annotation: Any = str) -> Any:
    """The answer in ``text``: what follows its last "Answer:" line if it has one (the roles ask for it), else the
    whole text, converted to ``annotation`` (``int``/``float`` take the last number, ``bool`` a yes/no).
    Returns the text itself when conversion is impossible, so nothing the worker said is lost."""
    answer = _answer(text)
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


def _answer(text: str) -> str:
    """What follows the last "Answer:" line, else the whole text. An answer that starts on a line below its marker
    and lists two items or more, one a line ("- Yes", "- No", as a model echoing a question's options writes), is
    kept whole to its paragraph's end: its first item is no more the answer than the others."""
    markers = list(_ANSWER_LINE.finditer(text))
    if not markers:
        return text.strip()
    last = markers[-1]
    if "\n" in last["gap"]:
        paragraph = re.split(r"\n\s*\n", text[last.start("answer") :])[0]
        if sum(bool(_LIST_ITEM.match(line)) for line in paragraph.splitlines()) >= 2:
            return paragraph.strip()
    return last["answer"].strip()


def bare_answer(text: str) -> str:
    """The reply's answer (its last "Answer:" line, else all of it) without the markdown decoration around it."""
    return extract_answer(text).strip(_DECORATION)


def normalise(text: str) -> str:
    """Text as compared for exact match: trimmed, case-folded, inner spaces collapsed, trailing full stops dropped."""
    return _SPACES.sub(" ", text.strip()).casefold().rstrip(".").rstrip()


def option_labels(count: int) -> list[str]:
    """Labels for ``count`` options: letters A, B, ... up to 26 options, numbers 1, 2, ... beyond."""
    return [chr(ord("A") + i) for i in range(count)] if count <= 26 else [str(i + 1) for i in range(count)]


def format_options(options: Sequence[str]) -> str:
    """The options as lines "A. text", to append to a question."""
    return "\n".join(f"{label}. {option}" for label, option in zip(option_labels(len(options)), options, strict=True))


def _label_pattern(labels: Sequence[str]) -> str:
    alternatives = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    return rf"(?:{alternatives})"


def _answer_block(text: str) -> str:
    """What follows the reply's last answer marker (an "Answer:" line or "answer is"), the lines after it included;
    else all of it."""
    ends = [m.start("answer") for m in _ANSWER_LINE.finditer(text)] + [m.end() for m in _STATED.finditer(text)]
    return text[max(ends) :] if ends else text


def _lists_options(block: str, options: Sequence[str], labels: Sequence[str]) -> bool:
    """Whether ``block`` names two options or more one a line, each by its text (a list's bullet aside) or by a
    label leading the line ("A.", "(B)", "C)")."""
    label = _label_pattern(labels)
    named = set()
    for line in block.splitlines():
        led = re.match(rf"\s*[-*•]?\s*\(?({label})\)?[.):\]]", line)
        item = normalise(_BULLET.sub("", line).strip(_DECORATION))
        if led:
            named.add(labels.index(led.group(1)))
        elif item in options:
            named.add(options.index(item))
    return len(named) >= 2


def choice_index(text: str, options: Sequence[str]) -> int | None:
    """Which of ``options`` (labelled by ``option_labels``) the reply picks, or None if it picks none clearly.

    None where what follows the reply's last answer marker ("Answer:" or "answer is"; else all of it) lists two
    options or more one a line ("- Yes", "- No" or "A. text", "B. text"), as a model echoing the question writes
    them. Otherwise looks at the reply's answer (its last "Answer:" line, else all of it) and accepts, in this
    order: an option's exact text; a label alone, in any case, or leading the answer ("b", "(B)", "B)", "B. text",
    but not the first of several lines that list options); a label after "answer is", "option" or "choice" anywhere
    in the reply (the last one wins); the one option whose text the answer contains (an option inside a longer
    contained one doesn't count), unless every mention of it is negated
    ("not True" picks neither True nor False).
    """
    labels = option_labels(len(options))
    normalised = [normalise(option) for option in options]
    if _lists_options(_answer_block(text), normalised, labels):
        return None
    answer = bare_answer(text)
    reply = normalise(answer)
    if reply in normalised:
        return normalised.index(reply)
    label = _label_pattern(labels)
    alone = re.fullmatch(rf"\(?({label})\)?[.):]?", answer, re.IGNORECASE)
    listed = {m.upper() for m in re.findall(rf"(?m)^\s*\(?({label})\)?[.):\]]", answer)}
    leading = alone or (len(listed) < 2 and re.match(rf"\(?({label})\)?[.):\]]", answer))  # not an echoed list
    if leading:
        return labels.index(leading.group(1).upper())
    stated = re.findall(rf"\b(?i:answer|option|choice)(?:\s+is)?\s*[:=-]?\s*\(?({label})\)?(?!\w)", text)
    if stated:
        return labels.index(stated[-1])
    contained = {option for option in normalised if re.search(rf"(?<!\w){re.escape(option)}(?!\w)", reply)}
    outermost = [o for o in contained if not any(o != other and o in other for other in contained)]
    if len(outermost) != 1:
        return None
    affirmed = re.search(rf"(?<!\w)(?<!not )(?<!n't ){re.escape(outermost[0])}(?!\w)", reply)
    return normalised.index(outermost[0]) if affirmed else None
