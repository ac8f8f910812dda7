"""The Wilson score interval of a proportion: the bench's accuracy intervals and expert iteration's keep rule."""

from __future__ import annotations

import math

Z_95 = 1.959963984540054  # the standard normal quantile of 0.975


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion, ``(low, high)``: unlike the normal approximation it stays inside
    [0, 1] and is sensible at 0 or n successes and for small n. ``(0, 1)`` when ``n`` is 0. It always holds the
    observed share (at 0 or n successes rounding would otherwise leave it a hair outside)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))
