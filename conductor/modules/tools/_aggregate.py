"""Deterministic workers that answer from the earlier steps they are shown: ``vote`` and ``check``.

They are what makes access lists matter. Alone (seeing no earlier step) they have nothing to work on and say so;
shown the candidate answers of earlier steps they pick among them as real orchestration systems do: a majority
vote (self-consistency), or a checker that keeps the candidate that names one of the task's options, recomputes the
arithmetic a candidate wrote, or runs candidate programs against the task's examples in the sandbox.

Both read the prompt the executor builds for a step (``WorkerPromptAdapter``): the overall task, the earlier steps
it may see (each one's subtask and response, as ``run/_executor.py``'s ``_context`` writes them) and its own subtask.
"""

from __future__ import annotations

import logging
import re
import textwrap
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from conductor.errors import CodeTimeout, ToolInputError
from conductor.modules._answer import choice_index, extract_answer, normalise, option_labels
from conductor.modules._syntax import parse_python
from conductor.modules.tools._calculator import calculate, extract_expression
from conductor.modules.tools._sandbox import Isolation, extract_code, run_python
from conductor.modules.workers import ToolWorker
from conductor.modules.workflow import INPUT_TITLES

logger = logging.getLogger(__name__)

_TASK = f"{INPUT_TITLES['question']}:\n"
_CONTEXT = f"\n\n{INPUT_TITLES['context']}:\n"
_SUBTASK = f"\n\n{INPUT_TITLES['subtask']}:\n"
_STEP = re.compile(r"(?:^|\n\n)Step (\d+) \(Model (\d+)\) subtask: ")
_OPTION = re.compile(r"^[ \t]*\(?([A-Z])[.)][ \t]+(\S.*?)[ \t]*$", re.M)
# an unlettered list under its own header, as BIG-Bench-Hard writes yes/no and valid/invalid questions
_BULLETED = re.compile(r"^[ \t]*(?:options|choices):[ \t]*\n((?:[ \t]*[-*•][ \t]+\S[^\n]*(?:\n|$))+)", re.M | re.I)
_BULLET = re.compile(r"^[ \t]*[-*•][ \t]+")
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ToolPrompt:
    """A step's prompt taken apart: the overall task, the responses of the earlier steps it sees (in order), the
    subtask."""

    task: str
    responses: tuple[str, ...]
    subtask: str


def parse_prompt(text: str) -> ToolPrompt:
    """Split the user message a step's worker gets into its parts (parts the prompt lacks are empty)."""
    start = text.find(_TASK)
    body = text[start + len(_TASK) :] if start >= 0 else text
    cut = body.rfind(_SUBTASK)
    body, subtask = (body[:cut], body[cut + len(_SUBTASK) :]) if cut >= 0 else (body, "")
    task, _, context = body.partition(_CONTEXT)
    return ToolPrompt(task.strip(), _responses(context), subtask.strip())


def _responses(context: str) -> tuple[str, ...]:
    """The responses in an "Earlier steps" section. A step header counts only when its number is above the last
    one's, so a response that echoes an earlier step's header stays part of that response."""
    headers, last = [], -1
    for match in _STEP.finditer(context):
        if int(match[1]) > last:
            headers.append(match)
            last = int(match[1])
    responses = []
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(context)
        marker = f"\nStep {header[1]} (Model {header[2]}) response:\n"
        _, found, response = context[header.end() : end].partition(marker)
        if found:
            responses.append(response.strip())
    return tuple(responses)


# ---- answers -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choices:
    """A task's options: their texts, and the name a tool answers with for each (its letter, or its text where the
    task lists them without letters)."""

    texts: tuple[str, ...] = ()
    names: tuple[str, ...] = ()


def options(task: str) -> Choices:
    """The options listed in ``task``: the last run of lettered lines ("A. text" or "(A) text") that starts at A and
    goes on without a gap; else the last bulleted list ("- text" lines) right under an "Options:" line; none when
    there are fewer than two."""
    runs: list[list[str]] = []
    for match in _OPTION.finditer(task):
        label, text = match[1], match[2]
        if label == "A":
            runs.append([text])
        elif runs and ord(label) - ord("A") == len(runs[-1]):
            runs[-1].append(text)
    lettered = next((run for run in reversed(runs) if len(run) >= 2), [])
    if lettered:
        return Choices(tuple(lettered), tuple(option_labels(len(lettered))))
    lists = [
        [_BULLET.sub("", line).strip() for line in block.splitlines() if line.strip()]
        for block in _BULLETED.findall(task)
    ]
    bulleted = next((items for items in reversed(lists) if len(items) >= 2), [])
    return Choices(tuple(bulleted), tuple(bulleted))


def closest_option(response: str, choices: Sequence[str]) -> int | None:
    """The option whose words the response shares most of (as a share of the option's words), or None on a tie or
    when it shares none: how a checker maps free text that names no option onto one."""
    words = set(_WORD.findall(response.casefold()))
    scores = []
    for choice in choices:
        own = set(_WORD.findall(choice.casefold()))
        scores.append(len(own & words) / len(own) if own else 0.0)
    best = max(scores)
    return scores.index(best) if best > 0 and scores.count(best) == 1 else None


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def answer_key(response: str, choices: Sequence[str]) -> Hashable | None:
    """What a response votes for: the option it names (by index) when the task has options, else the last number of
    its answer, else its answer's text without case or spacing; None if it gives no answer."""
    if choices:
        return choice_index(response, choices)
    value = extract_answer(response, float)
    if isinstance(value, int | float):
        return _number(value)
    return normalise(extract_answer(response)) or None


# ---- vote ----------------------------------------------------------------------------------------------------------
def vote(prompt: str) -> str:
    """The majority answer of the earlier steps shown (ties go to the earliest), as "Answer: X": an option's name
    (its letter, or its text when unlettered) when the task lists options, a number, or the earliest wording of the
    winning text. Steps that give no answer don't vote; ``ToolInputError`` when none is left."""
    parsed = parse_prompt(prompt)
    if not parsed.responses:
        raise ToolInputError("nothing to vote on: give this step access to the earlier steps' answers")
    choices = options(parsed.task)
    keys = [answer_key(response, choices.texts) for response in parsed.responses]
    voters = [(key, response) for key, response in zip(keys, parsed.responses, strict=True) if key is not None]
    if not voters:
        raise ToolInputError(f"none of the {len(keys)} earlier responses gives an answer to vote on")
    counts = Counter(key for key, _ in voters)
    winner = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts, and keys count in step order
    if choices.texts:
        return f"Answer: {choices.names[winner]}"  # type: ignore[index]
    if isinstance(winner, int | float):
        return f"Answer: {winner}"
    answer = extract_answer(next(r for k, r in voters if k == winner))
    # a list (an echo of the options) starts below its marker, where readers keep it whole and take no item as the pick
    return f"Answer:\n{answer}" if "\n" in answer else f"Answer: {answer}"


# ---- check ---------------------------------------------------------------------------------------------------------
_DEF = re.compile(r"^def\s+(\w+)\s*\(", re.M)
_QUOTES = r"(?:\"\"\"|''')"  # a docstring's ends
_DOCTEST = re.compile(rf"^[ \t]*>>>[ \t]?(.+)\n((?:[ \t]*(?!>>>|{_QUOTES})\S.*\n?)+)", re.M)
_SHOWN = r"(?:==|➞|=>|->|should return)"  # how docstrings show a call's result
_EXAMPLE = rf"^[ \t]*{_QUOTES}?({{name}}\(.*?\))[ \t]*{_SHOWN}[ \t]*(.+?)[ \t.]*{_QUOTES}?[ \t]*$"

# Runs each test in the sandbox after the candidate's program and prints how many pass; nothing else is printed.
_HARNESS = """\
import contextlib, io
namespace = {{"__name__": "candidate"}}
passed = 0
with contextlib.redirect_stdout(io.StringIO()):
    try:
        exec(compile({program!r}, "<candidate>", "exec"), namespace)
        loaded = True
    except BaseException:
        loaded = False
    for call, expected in {tests!r} if loaded else ():
        try:
            value = eval(call, namespace)
            try:
                passed += value == eval(expected, namespace)
            except BaseException:
                passed += repr(value) == expected.strip()
        except BaseException:
            pass
print("passed", int(loaded), passed)
"""
_PASSED = re.compile(r"^passed (\d) (\d+)$", re.M)


def function_tests(task: str, name: str) -> list[tuple[str, str]]:
    """The examples in a function's docstring as (call, expected) pairs: ``>>> call`` with the lines below it, and
    lines like ``name(args) == value`` (or ``➞``, ``=>``, ``->``, "should return")."""
    tests = [(call.strip(), expected.strip().removesuffix('"""').rstrip()) for call, expected in _DOCTEST.findall(task)]
    pattern = re.compile(_EXAMPLE.replace("{name}", re.escape(name)), re.M)
    tests += [(call, expected) for call, expected in pattern.findall(task) if (call, expected) not in tests]
    return tests


def completed_program(task: str, response: str, name: str) -> str:
    """The program a candidate stands for: its code (a fenced block, else the text) after the task's stub when the
    code defines ``name`` itself (the stub brings the imports), else the stub completed with the code as its body
    (re-indented: responses come stripped, which takes the indentation off a body's first line)."""
    try:
        code = extract_code(response)
    except ToolInputError:
        code = response
    if re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.M):
        return f"{task}\n{code}"
    bodies = [f"    {code.lstrip()}", textwrap.indent(textwrap.dedent(code), "    ")]
    return next((f"{task}\n{body}" for body in bodies if _compiles(f"{task}\n{body}")), f"{task}\n{bodies[0]}")


def _compiles(program: str) -> bool:
    try:
        parse_python(program)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class _Score:
    loaded: bool
    passed: int


def _score(program: str, tests: list[tuple[str, str]], isolation: Isolation, timeout_s: float) -> _Score:
    try:
        output = run_python(_HARNESS.format(program=program, tests=tests), timeout_s=timeout_s, isolation=isolation)
    except CodeTimeout:
        return _Score(False, 0)
    found = _PASSED.findall(output)
    return _Score(found[-1][0] == "1", int(found[-1][1])) if found else _Score(False, 0)


class Checker:
    """``check``: verifies the candidate answers of the earlier steps shown, by the kind of task.

    - Multiple choice (the task lists options, lettered or under "Options:"): the latest candidate that names an
      option wins, "Answer: X" (its letter, or its text when unlettered); when none names one, the option whose words
      the latest candidate shares most of.
    - Code (the task is a function stub): each candidate's program runs against the examples in the docstring in the
      sandbox; the one that passes most (the earliest on a tie, a program that loads before one that doesn't) is the
      answer, as a fenced block.
    - Otherwise arithmetic: the value of the expression the latest candidate that writes one gives, recomputed.
    """

    def __init__(self, isolation: Isolation = "bwrap", code_timeout_s: float = 10.0):
        self.isolation = isolation
        self.code_timeout_s = code_timeout_s

    def __call__(self, prompt: str) -> str:
        parsed = parse_prompt(prompt)
        if not parsed.responses:
            raise ToolInputError("nothing to check: give this step access to an earlier step's answer")
        choices = options(parsed.task)
        if choices.texts:
            return self.option(parsed.responses, choices)
        functions = _DEF.findall(parsed.task)
        if functions:
            return self.program(parsed.task, parsed.responses, functions[-1])
        return self.recompute(parsed.responses)

    @staticmethod
    def option(responses: Sequence[str], choices: Choices) -> str:
        picked = next((i for r in reversed(responses) if (i := choice_index(r, choices.texts)) is not None), None)
        if picked is None:
            picked = closest_option(responses[-1], choices.texts)
        if picked is None:
            raise ToolInputError("no candidate names one of the options")
        return f"Answer: {choices.names[picked]}"

    def program(self, task: str, responses: Sequence[str], name: str) -> str:
        tests = function_tests(task, name)
        programs = [completed_program(task, response, name) for response in responses]
        scores = [_score(program, tests, self.isolation, self.code_timeout_s) for program in programs]
        best = max(range(len(programs)), key=lambda i: (scores[i].loaded, scores[i].passed))  # the earliest of ties
        note = f"# passes {scores[best].passed} of the task's {len(tests)} examples"
        return f"```python\n{note}\n{programs[best]}\n```"

    @staticmethod
    def recompute(responses: Sequence[str]) -> str:
        for response in reversed(responses):
            try:
                expression = extract_expression(response)
            except ToolInputError:
                continue
            return f"Answer: {calculate(expression)}"
        raise ToolInputError("no candidate writes an arithmetic expression to recompute")


class VoteWorker(ToolWorker):
    """Answers with the majority answer of the earlier steps it sees (see ``vote``)."""

    def __init__(
        self,
        name: str = "vote",
        *,
        description: str = "Majority vote over the final answers of the earlier steps it is shown",
        **worker_kwargs: Any,
    ):
        super().__init__(name, vote, description=description, **worker_kwargs)


class CheckWorker(ToolWorker):
    """Answers with the candidate of the earlier steps it sees that checks out (see ``Checker``). It runs candidate
    code in the sandbox of ``run_python``; ``isolation="none"`` runs it unisolated (for trusted code only)."""

    def __init__(
        self,
        name: str = "check",
        *,
        isolation: Isolation = "bwrap",
        code_timeout_s: float = 10.0,
        description: str = (
            "Checks the candidate answers of the earlier steps it is shown: picks the option a candidate names, "
            "recomputes its arithmetic, or runs candidate code against the task's examples"
        ),
        **worker_kwargs: Any,
    ):
        super().__init__(name, Checker(isolation, code_timeout_s), description=description, **worker_kwargs)
        if isolation == "none":
            logger.warning("UNISOLATED: the check tool %r runs candidate code without an OS sandbox", name)
