"""Python's parser, made safe to call from many threads at once on CPython 3.11.

CPython 3.11 keeps the AST constructor's recursion depth in state shared by the whole interpreter (gh-106905). When a
thread building a tree lets another build one in between (a garbage collection running a finalizer, or a thread
switch inside one), the first fails with a spurious ``SystemError: AST constructor recursion depth mismatch``; it is
a false alarm about bookkeeping, not about the source. A lock can't prevent it, since libraries beside ours
(DSPy's output parsing) parse without it, so the parse is tried again: the source is the same, and a second
collision in a row is rare enough to stay unseen."""

from __future__ import annotations

import ast
from typing import Literal

_ATTEMPTS = 3
_MISMATCH = "AST constructor recursion depth mismatch"


def parse_python(source: str, mode: Literal["exec", "eval"] = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, tried again when another parse in the process disturbed it."""
    for _ in range(_ATTEMPTS - 1):
        try:
            return ast.parse(source, mode=mode)
        except SystemError as error:
            if _MISMATCH not in str(error):
                raise
    return ast.parse(source, mode=mode)


def python_literal(source: str) -> object:
    """``ast.literal_eval(source)`` through :func:`parse_python`."""
    return ast.literal_eval(parse_python(source.lstrip(" \t"), mode="eval"))
