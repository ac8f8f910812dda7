"""An exact arithmetic calculator (an ``ast`` walk over a whitelist, never ``eval``) and its worker.

It never answers silently wrong: ``0x10`` is the hexadecimal literal 16 (as in Python, which parses the expression),
not ``0 × 10``, since no one writes "zero times ten" that way while hexadecimal, binary (``0b``) and octal (``0o``)
literals are everyday notation in the code-adjacent prompts this tool serves; and a result too small for a float
(an underflow, which floats round to 0 or to a few digits) is an error rather than 0.
"""

from __future__ import annotations

import ast
import decimal
import math
import operator
import re
import sys
from collections.abc import Callable
from typing import Any

from conductor.errors import ToolInputError
from conductor.modules._syntax import parse_python
from conductor.modules.workers import ToolWorker

_MAX_EXPRESSION_CHARS = 1000
_MAX_DIGITS = 10_000
_MAX_BITS = math.ceil(_MAX_DIGITS * math.log2(10))
_MAX_FACTORIAL = 1000
_MAX_ROUND_DIGITS = 1000


def _integer(value: int | float, what: str) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise ToolInputError(f"{what} needs a whole number, not {value!r}")
    return value


def _sqrt(x: int | float) -> int | float:
    """Exact for perfect squares of any size; a float otherwise."""
    if isinstance(x, int) and x >= 0 and math.isqrt(x) ** 2 == x:
        return math.isqrt(x)
    return math.sqrt(x)


def _factorial(x: int | float) -> int:
    n = _integer(x, "factorial")
    if not 0 <= n <= _MAX_FACTORIAL:
        raise ToolInputError(f"factorial needs a whole number from 0 to {_MAX_FACTORIAL}, not {n}")
    return math.factorial(n)


def _round(x: int | float, ndigits: int | float | None = None) -> int | float:
    if ndigits is None:
        return round(x)
    n = _integer(ndigits, "round's digits")
    if abs(n) > _MAX_ROUND_DIGITS:
        raise ToolInputError(f"round's digits must be within ±{_MAX_ROUND_DIGITS}")
    return round(x, n)


def _power(base: int | float, exponent: int | float) -> int | float:
    """``base ** exponent``, refusing exact powers too large to compute before computing them."""
    exact = isinstance(base, int) and isinstance(exponent, int)
    if exact and exponent > 0 and (abs(base).bit_length() - 1) * exponent > _MAX_BITS:
        raise ToolInputError(f"result too large: more than {_MAX_DIGITS:,} digits")
    return base**exponent


# name: (function, fewest arguments, most arguments)
_FUNCTIONS: dict[str, tuple[Callable[..., int | float], int, int]] = {
    "sqrt": (_sqrt, 1, 1),
    "log": (math.log, 1, 2),
    "log10": (math.log10, 1, 1),
    "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "min": (lambda *xs: min(xs), 1, 100),
    "max": (lambda *xs: max(xs), 1, 100),
    "factorial": (_factorial, 1, 1),
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "π": math.pi}
_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], int | float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
# Functions whose arguments are separated by commas, so "max(1,000)" is not one thousand.
_MULTI_ARGUMENT = frozenset(name for name, (_, _, most) in _FUNCTIONS.items() if most > 1)
_THOUSANDS = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\w,])")
_CALL_OR_CLOSE = re.compile(r"([A-Za-z_]\w*)?\s*\(|\)")
# "x" between numbers is a times sign, except right after a number's leading 0: "0x10" is hexadecimal.
_TIMES_X = re.compile(r"(?<=[\d.)])\s*(?<!(?<![\w.])0)x\s*(?=[\d.(])")
_PREFIXED_INTEGER = r"(?<![\w.])0(?:[xX][\da-fA-F_]+|[bB][01_]+|[oO][0-7_]+)(?![\w.])"
# Operators written as words between two operands ("What is 772 minus 949?", as BIG-bench's arithmetic task asks).
_WORD_OPERATORS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*", "divided by": "/"}
_WORD_OPERATOR = re.compile(rf"(?<=[\d)])\s+({'|'.join(_WORD_OPERATORS)})\s+(?=[\d(-])", re.IGNORECASE)
_NAMES = "|".join(sorted(map(re.escape, [*_FUNCTIONS, *_CONSTANTS]), key=len, reverse=True))
_CANDIDATE = re.compile(
    rf"(?:{_PREFIXED_INTEGER}|[\d.+\-*/^%(),×÷− \t]|(?<![A-Za-z_])(?:{_NAMES})(?![A-Za-z_])"
    rf"|(?<=[\d) \t])(?<!(?<![\w.])0)x(?=[\d( \t]))+"
)
_SMALLEST_FLOAT = sys.float_info.min  # below it floats lose digits (subnormals) and then reach 0


def _innermost_call(text: str, position: int) -> str | None:
    """The function whose parentheses enclose ``position`` most closely (None: none, or plain parentheses)."""
    stack: list[str | None] = []
    for match in _CALL_OR_CLOSE.finditer(text, 0, position):
        if match.group() != ")":
            stack.append(match.group(1))
        elif stack:
            stack.pop()
    return stack[-1] if stack else None


def _normalize(expression: str) -> str:
    """Accept everyday notation: ``^`` for power, ``×``/``x``/``÷``/``−``, and thousands separators like 1,000."""
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-")
    text = _TIMES_X.sub("*", text)
    return _THOUSANDS.sub(
        lambda m: m.group() if _innermost_call(text, m.start()) in _MULTI_ARGUMENT else m.group().replace(",", ""),
        text,
    )


def _check(node: ast.expr) -> None:
    """Refuse anything but numbers, the constants, arithmetic operators and calls of the allowed functions."""
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise ToolInputError(f"only numbers are allowed, not {node.value!r}")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ToolInputError("number too large")
    elif isinstance(node, ast.Name):
        if node.id not in _CONSTANTS:
            raise ToolInputError(f"unknown name {node.id!r}: the constants are {', '.join(_CONSTANTS)}")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        _check(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        _check(node.left)
        _check(node.right)
    elif isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS:
            known = ", ".join(_FUNCTIONS)
            raise ToolInputError(f"unknown function {ast.unparse(node.func)!r}: the functions are {known}")
        _, fewest, most = _FUNCTIONS[name]
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ToolInputError(f"{name} takes plain arguments only")
        if not fewest <= len(node.args) <= most:
            raise ToolInputError(f"{name} takes {fewest}{f' to {most}' if most > fewest else ''} argument(s)")
        for argument in node.args:
            _check(argument)
    elif isinstance(node, ast.Attribute):
        raise ToolInputError("attribute access is not allowed")
    else:
        raise ToolInputError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _parse(expression: str) -> tuple[ast.expr, str]:
    """The checked syntax tree of ``expression`` and the normalized text it was parsed from; ``ToolInputError`` if it
    is not an allowed arithmetic expression."""
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ToolInputError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    text = _normalize(expression).strip()
    if not text:
        raise ToolInputError("empty expression")
    try:
        tree = parse_python(text, mode="eval")
        _check(tree.body)
    except (SyntaxError, ValueError):
        raise ToolInputError(f"not an arithmetic expression: {expression!r}") from None
    except RecursionError:
        raise ToolInputError("expression nested too deeply") from None
    return tree.body, text


_TINY = f"below {_SMALLEST_FLOAT:.3g} in size, floats keep too few digits or become 0"


def _refuse_underflowed_numbers(tree: ast.expr, text: str) -> None:
    """Refuse a number written too small for a float (``1e-400``, which Python reads as 0)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, float) and abs(node.value) < _SMALLEST_FLOAT:
            literal = ast.get_source_segment(text, node) or ""
            if any(digit in re.split("[eE]", literal)[0] for digit in "123456789"):
                raise ToolInputError(f"the number {literal} is too small: {_TINY}")


def _exactly_nonzero(node: ast.expr, operands: list[int | float]) -> bool:
    """Whether the exact result of ``node`` on ``operands`` is sure not to be 0: a product of non-zero numbers, a
    quotient or power of a non-zero number, an exponential."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return all(operands)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.Pow):
        return operands[0] != 0
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "exp"


def _evaluate(node: ast.expr) -> int | float:
    """Evaluate a tree ``_check`` accepted; every intermediate result is bounded in size, and none underflows."""
    operands: list[int | float] = []
    if isinstance(node, ast.Constant):
        value = node.value
    elif isinstance(node, ast.Name):
        value = _CONSTANTS[node.id]
    elif isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand)
        value = -operand if isinstance(node.op, ast.USub) else +operand
    elif isinstance(node, ast.BinOp):
        operands = [_evaluate(node.left), _evaluate(node.right)]
        value = _OPERATORS[type(node.op)](*operands)
    else:
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        operands = [_evaluate(a) for a in node.args]
        value = _FUNCTIONS[node.func.id][0](*operands)
    if isinstance(value, complex):
        raise ToolInputError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolInputError("result too large")
    if isinstance(value, float) and abs(value) < _SMALLEST_FLOAT and (value or _exactly_nonzero(node, operands)):
        raise ToolInputError(f"result too small: {ast.unparse(node)} underflows ({_TINY})")
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise ToolInputError(f"result too large: more than {_MAX_DIGITS:,} digits")
    return value


def _format(value: int | float) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return format(decimal.Decimal(value), "f")  # not str(): that refuses ints over 4,300 digits


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression without ``eval``: integers stay exact, floats print at full precision.

    Allowed: numbers, ``+ - * / // % **`` (``^`` too), parentheses, pi, e, and sqrt, log, log10, exp, sin, cos, tan,
    abs, round, floor, ceil, min, max, factorial; integers may be written in hexadecimal, binary or octal (``0x10``).
    Results over 10,000 digits, factorials over 1000 and expressions over 1000 characters are refused before any work
    is done, so no input can make it run long; results too small for a float are refused rather than rounded to 0.
    """
    tree, text = _parse(expression)
    _refuse_underflowed_numbers(tree, text)
    try:
        return _format(_evaluate(tree))
    except ZeroDivisionError:
        raise ToolInputError(f"division by zero in {expression.strip()!r}") from None
    except OverflowError:
        raise ToolInputError("result too large") from None
    except ValueError as exc:
        raise ToolInputError(f"math error: {exc}") from None
    except RecursionError:
        raise ToolInputError("expression nested too deeply") from None


def _trim(candidate: str) -> str:
    """Drop what a sentence leaves around an expression: spaces, commas, a full stop, dangling operators, unmatched
    parentheses."""
    kept: list[str] = []
    opened: list[int] = []
    for char in candidate:
        if char == "(":
            opened.append(len(kept))
        elif char == ")":
            if not opened:
                continue
            opened.pop()
        kept.append(char)
    for index in reversed(opened):
        del kept[index]
    return "".join(kept).lstrip(" \t,").rstrip(" \t,.+-*/^%×÷−")


def _parses(expression: str) -> bool:
    try:
        _parse(expression)
    except ToolInputError:
        return False
    return True


def extract_expression(text: str) -> str:
    """The arithmetic expression a prompt asks about: the whole text if it is one, else the last expression in it.

    Expressions with an operator or a function call win over bare numbers, so in "compute 17*23+4 for step 2" the
    answer is "17*23+4". Operators written as words between numbers count: "772 minus 949" is "772 - 949".
    """
    text = _WORD_OPERATOR.sub(lambda m: f" {_WORD_OPERATORS[m[1].lower()]} ", text)
    if _parses(text):
        return text.strip()
    candidates = [c for c in map(_trim, _CANDIDATE.findall(text)) if any(ch.isdigit() for ch in c) and _parses(c)]
    if not candidates:
        raise ToolInputError("no arithmetic expression found")
    formulas = [c for c in candidates if not isinstance(_parse(c)[0], ast.Constant)]
    return (formulas or candidates)[-1]


class CalculatorWorker(ToolWorker):
    """Answers with the exact value of the arithmetic expression in its prompt (see ``extract_expression``)."""

    def __init__(
        self,
        name: str = "calculator",
        *,
        description: str = "Evaluates arithmetic expressions exactly",
        **worker_kwargs: Any,
    ):
        super().__init__(name, calculate, extract=extract_expression, description=description, **worker_kwargs)
