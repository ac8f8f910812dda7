"""The paired comparison's counts, interval and test, against published values."""

import pytest

from conductor import ConductorError
from conductor.optimizers._paired import (
    mcnemar_exact_p,
    paired_comparison,
    paired_difference_interval,
    paired_table,
)


def test_mcnemar_exact_p_matches_the_binomial_test():
    assert mcnemar_exact_p(10, 17) == pytest.approx(0.248, abs=5e-4)
    assert mcnemar_exact_p(17, 10) == mcnemar_exact_p(10, 17)
    # Cavo et al. (2012) in Fagerland, Lydersen and Laake, Statistical Analysis of Contingency Tables (2017), ch. 8:
    # the exact conditional McNemar test of 6 against 16 discordant pairs, p = 0.052
    assert mcnemar_exact_p(16, 6) == pytest.approx(0.0525, abs=5e-5)
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(3, 3) == 1.0
    assert mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)


def test_the_interval_matches_newcombe_s_published_example():
    # Cavo et al. (2012), the same source: 59 both, 6 only the first, 16 only the second, 80 neither; Newcombe's
    # square-and-add interval for the first's proportion minus the second's is -0.0621 (-0.1186 to -0.0046)
    low, high = paired_difference_interval(both_right=59, only_a=16, only_b=6, neither=80)
    assert (low, high) == pytest.approx((-0.1186, -0.0046), abs=5e-5)


def test_the_interval_holds_the_difference_and_widens_with_fewer_questions():
    low, high = paired_difference_interval(30, 5, 15, 50)
    assert low < 0.1 < high and low > 0  # 10 points on 100 questions, 15 against 5: told apart from 0
    small_low, small_high = paired_difference_interval(3, 1, 2, 4)  # the same shares on 10 questions
    assert small_low < low and small_high > high
    low, high = paired_difference_interval(0, 0, 10, 0)  # b right on all 10, a on none: never past 1
    assert 0 < low < 1 and high == pytest.approx(1.0)
    low, high = paired_difference_interval(10, 0, 0, 0)  # both right on all: symmetric about 0
    assert low == pytest.approx(-high) and high > 0


def test_counts_treat_a_score_of_half_or_more_as_right():
    comparison = paired_comparison([1, 0.5, 0.4, 0, 1], [True, 0.2, 0.9, 0.0, 1.0], a="warm start", b="grpo")
    assert (comparison.both_right, comparison.only_a, comparison.only_b, comparison.neither) == (2, 1, 1, 1)
    assert (comparison.accuracy_a, comparison.accuracy_b, comparison.difference) == (0.6, 0.6, 0.0)
    assert comparison.p_value == 1.0 and comparison.low < 0 < comparison.high
    (header, _, row) = paired_table([comparison], a="start", b="phase")
    assert header.startswith("| phase | start | n | both right | only phase | only start | neither |")
    assert row.startswith("| grpo | warm start | 5 | 2 | 1 | 1 | 1 | 0.600 | 0.600 | +0.0 (")


def test_scores_of_different_questions_are_refused():
    with pytest.raises(ConductorError, match="the same questions: a has 2, b 3"):
        paired_comparison([1, 0], [1, 0, 1])
    with pytest.raises(ConductorError, match="the same questions"):
        paired_comparison([], [])
