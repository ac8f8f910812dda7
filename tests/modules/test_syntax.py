"""Python's parser from many threads: CPython 3.11 shares the AST constructor's depth count across the interpreter
(gh-106905), so a parse that another parse interrupts fails with a spurious SystemError. CI failed on it once, in a
compile whose rollout threads read workflows while tool threads parsed arithmetic."""

import ast
import gc

import pytest

from conductor.modules._syntax import parse_python, python_literal

TEXT = "[" + ", ".join(["[1, 'a']"] * 50) + "]"


class _ParsesWhenCollected:
    """Garbage whose finalizer parses Python, as a library's object might: a collection that runs it in the middle
    of another parse is the interruption another thread's parse would be."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("0")


def _interrupted(parse, text):
    """``parse(text)`` with garbage waiting that the first allocation inside the tree's construction collects."""
    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        _ParsesWhenCollected()
        return parse(text)
    finally:
        gc.set_threshold(*threshold)


@pytest.fixture(autouse=True)
def _interpreter_has_the_flaw():
    try:
        _interrupted(ast.parse, TEXT)
    except SystemError as error:
        assert "recursion depth mismatch" in str(error)
    else:
        pytest.skip("this interpreter's parser keeps no shared depth count to disturb (gh-106905)")


def test_an_interrupted_parse_is_tried_again_and_gives_the_tree():
    tree = _interrupted(lambda text: parse_python(text, mode="eval"), TEXT)
    assert ast.dump(tree) == ast.dump(ast.parse(TEXT, mode="eval"))


def test_an_interrupted_literal_is_read():
    assert _interrupted(python_literal, TEXT) == [[1, "a"]] * 50


def test_a_real_syntax_error_is_still_one():
    with pytest.raises(SyntaxError):
        _interrupted(parse_python, TEXT + "]")
