"""The calculator never answers silently wrong: prefixed integer literals are read as written, and results (or
numbers) too small for a float are refused instead of becoming 0."""

from __future__ import annotations

import pytest

from conductor.errors import ToolInputError
from conductor.modules.tools import CalculatorWorker, calculate, extract_expression


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("0x10", "16"),
        ("0X1f + 1", "32"),
        ("0x10 * 2", "32"),
        ("0b101", "5"),
        ("0o17", "15"),
        ("0xFF_FF", "65535"),
        ("(0x10)x2", "32"),  # a times sign after a parenthesis is still one
        ("2x3", "6"),
        ("10x10", "100"),  # only a number's leading 0 makes a prefix
        ("0 x 5", "0"),  # spaced out, x is a times sign
        ("1.0x5", "5"),
    ],
)
def test_prefixed_integers_are_read_as_written_and_x_between_numbers_is_still_times(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is 0x1F + 1?", "0x1F + 1"),
        ("Convert 0b1010 to decimal", "0b1010"),
        ("compute 0x10 times 2 for me", "0x10 * 2"),
        ("What is 3 x 4?", "3 x 4"),
    ],
)
def test_extraction_keeps_a_prefixed_integer_whole(text, expected):
    assert extract_expression(text) == expected


def test_a_malformed_prefix_is_an_error_not_a_product():
    with pytest.raises(ToolInputError, match="not an arithmetic expression"):
        calculate("0x1G")


@pytest.mark.parametrize(
    "expression", ["1e-200 * 1e-200", "exp(-1000)", "2**-1100", "10**-400", "1/10**400", "0.5 ** 2000", "2**-1074"]
)
def test_a_result_that_underflows_is_an_error_not_zero(expression):
    with pytest.raises(ToolInputError, match=r"result too small: .* underflows"):
        calculate(expression)


@pytest.mark.parametrize("expression", ["1e-400", "1e-310 + 1", "2.5E-330 * 10"])
def test_a_number_written_too_small_for_a_float_is_an_error(expression):
    with pytest.raises(ToolInputError, match="too small"):
        calculate(expression)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("0 * 1e-300", "0"),
        ("0.0 * 5", "0"),
        ("5 - 5.0", "0"),
        ("0e-500", "0"),
        ("-0.0", "0"),
        ("round(1e-5, 2)", "0"),  # rounding to 0 is what was asked
        ("1 // 1e300", "0"),
        ("sin(0)", "0"),
        ("1e-300 * 1e-5", repr(1e-300 * 1e-5)),  # small, but a normal float
        ("2**-1022", repr(2.0**-1022)),  # the smallest normal float
    ],
)
def test_true_zeros_and_small_normal_results_are_still_answered(expression, expected):
    assert calculate(expression) == expected


def test_the_worker_reports_an_underflow_as_its_own_error():
    prompt = [{"role": "user", "content": "Subtask: compute 1e-200 * 1e-200"}]
    with pytest.raises(ToolInputError, match=r"^calc: result too small"):
        CalculatorWorker("calc").complete(prompt, max_tokens=64, temperature=0)
