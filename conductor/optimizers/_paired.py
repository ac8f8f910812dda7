"""Two programs scored on the same questions, compared question by question: which each got right, the difference in
accuracy with a 95% interval, and McNemar's exact test. A compile's phases are compared this way (``paired.md``),
since an unpaired comparison of two accuracies throws away that both answered the same questions.

The interval is Newcombe's hybrid score interval for paired proportions (method 10 of Newcombe, "Improved confidence
intervals for the difference between binomial proportions based on paired data", Statistics in Medicine 17, 1998):
each accuracy's Wilson interval, combined with the estimated correlation of the two programs' outcomes. It is chosen
because it keeps close to 95% coverage for the small n and the accuracies near 0 or 1 that compiles see, where the
Wald interval fails (Fagerland, Lydersen and Laake 2014 recommend it for paired proportions); it never leaves
[-1, 1]; it has a closed form, so no seed or resampling is needed; and it reuses the package's Wilson interval.

A metric may score in [0, 1] rather than 0 or 1: a question counts as right when its score is at least ``RIGHT``
(0.5, more right than wrong), so the counts, the interval and the test are those of right-or-wrong outcomes. The
built-in metrics score 0 or 1, for which this changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from conductor._stats import Z_95, wilson_interval
from conductor.errors import ConductorError

RIGHT = 0.5
"""A question whose score is at least this counts as right."""


@dataclass(frozen=True)
class PairedComparison:
    """Program ``b`` against program ``a`` on the same ``n`` questions. ``difference`` is b's accuracy minus a's,
    ``low`` and ``high`` its 95% interval (Newcombe's), ``p_value`` McNemar's exact two-sided p."""

    a: str
    b: str
    both_right: int
    only_a: int
    only_b: int
    neither: int
    low: float
    high: float
    p_value: float

    @property
    def n(self) -> int:
        return self.both_right + self.only_a + self.only_b + self.neither

    @property
    def accuracy_a(self) -> float:
        return (self.both_right + self.only_a) / self.n

    @property
    def accuracy_b(self) -> float:
        return (self.both_right + self.only_b) / self.n

    @property
    def difference(self) -> float:
        return (self.only_b - self.only_a) / self.n

    def as_dict(self) -> dict[str, str | int | float]:
        """Every field and derived figure, for JSON."""
        return {
            **asdict(self),
            "n": self.n,
            "accuracy_a": self.accuracy_a,
            "accuracy_b": self.accuracy_b,
            "difference": self.difference,
        }


def paired_comparison(
    a_scores: Sequence[float], b_scores: Sequence[float], *, a: str = "a", b: str = "b"
) -> PairedComparison:
    """Program ``b`` against program ``a`` from their scores on the same questions, in the same order."""
    if len(a_scores) != len(b_scores) or not a_scores:
        raise ConductorError(
            f"a paired comparison needs both programs' scores on the same questions: {a} has {len(a_scores)}, "
            f"{b} {len(b_scores)}"
        )
    pairs = [(float(x) >= RIGHT, float(y) >= RIGHT) for x, y in zip(a_scores, b_scores, strict=True)]
    both_right = sum(x and y for x, y in pairs)
    only_a = sum(x and not y for x, y in pairs)
    only_b = sum(y and not x for x, y in pairs)
    neither = len(pairs) - both_right - only_a - only_b
    low, high = paired_difference_interval(both_right, only_a, only_b, neither)
    return PairedComparison(a, b, both_right, only_a, only_b, neither, low, high, mcnemar_exact_p(only_a, only_b))


def paired_difference_interval(
    both_right: int, only_a: int, only_b: int, neither: int, z: float = Z_95
) -> tuple[float, float]:
    """Newcombe's interval (method 10) for b's accuracy minus a's, from the paired counts."""
    n = both_right + only_a + only_b + neither
    b_right, a_right = both_right + only_b, both_right + only_a
    p_b, p_a = b_right / n, a_right / n
    low_b, high_b = wilson_interval(b_right, n, z)
    low_a, high_a = wilson_interval(a_right, n, z)
    phi = _correlation(both_right, only_a, only_b, neither)
    below = math.sqrt((p_b - low_b) ** 2 + (high_a - p_a) ** 2 - 2 * phi * (p_b - low_b) * (high_a - p_a))
    above = math.sqrt((high_b - p_b) ** 2 + (p_a - low_a) ** 2 - 2 * phi * (high_b - p_b) * (p_a - low_a))
    return p_b - p_a - below, p_b - p_a + above


def _correlation(both_right: int, only_a: int, only_b: int, neither: int) -> float:
    """The outcomes' correlation as Newcombe corrects it: a positive one is shrunk by n/2 in its numerator (towards
    0, widening the interval), 0 when either program got every question right or every one wrong."""
    n = both_right + only_a + only_b + neither
    margins = (both_right + only_b) * (only_a + neither) * (both_right + only_a) * (only_b + neither)
    if margins == 0:
        return 0.0
    cross = both_right * neither - only_a * only_b
    if cross > n / 2:
        cross -= n / 2
    elif cross > 0:
        cross = 0
    return cross / math.sqrt(margins)


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p: under no difference each question only one program got right is equally likely
    to be either's, so the smaller count is binomial(only_a + only_b, 1/2)."""
    discordant = only_a + only_b
    tail = sum(math.comb(discordant, k) for k in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**discordant)


def paired_table(comparisons: Sequence[PairedComparison], *, a: str = "a", b: str = "b") -> list[str]:
    """The comparisons as Markdown lines, the programs' columns headed ``a`` and ``b``: counts, accuracies, the
    difference in points with its interval, p."""
    lines = [
        f"| {b} | {a} | n | both right | only {b} | only {a} | neither | {b} accuracy | {a} accuracy "
        f"| difference, points (95% interval) | McNemar p |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.b} | {c.a} | {c.n} | {c.both_right} | {c.only_b} | {c.only_a} | {c.neither} "
            f"| {c.accuracy_b:.3f} | {c.accuracy_a:.3f} "
            f"| {100 * c.difference:+.1f} ({100 * c.low:+.1f} to {100 * c.high:+.1f}) | {c.p_value:.3g} |"
        )
    return lines
