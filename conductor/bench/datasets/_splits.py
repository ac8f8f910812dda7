"""Seeded train/validation/test splits that never share a question."""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Sequence
from typing import NamedTuple

import dspy

from conductor.errors import ConfigError


class Splits(NamedTuple):
    """Three disjoint lists of examples."""

    train: list[dspy.Example]
    val: list[dspy.Example]
    test: list[dspy.Example]


def example_id(example: dspy.Example) -> str:
    """A stable id of an example: a hash of its question text, the same in every run and process."""
    return hashlib.sha256(example.question.encode("utf-8")).hexdigest()[:16]


def split(
    examples: Sequence[dspy.Example], seed: int, fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)
) -> Splits:
    """Shuffle the distinct questions with ``seed`` and cut them into train, validation and test by ``fractions``.

    Examples with the same question (benchmarks repeat a few) always land in the same part, so no question is both
    trained and tested on. The same examples and seed give the same splits. Fractions summing to less than 1 leave
    the rest out, to subsample a large benchmark.
    """
    if len(fractions) != 3 or min(fractions) < 0 or sum(fractions) > 1 + 1e-9:
        raise ConfigError(f"fractions must be three non-negative numbers summing to at most 1, not {fractions}")
    groups: dict[str, list[dspy.Example]] = {}
    for example in examples:
        groups.setdefault(example_id(example), []).append(example)
    ids = sorted(groups)
    random.Random(seed).shuffle(ids)
    bounds = [0, *(min(len(ids), round(len(ids) * math.fsum(fractions[:i]))) for i in (1, 2, 3))]
    parts = [ids[start:end] for start, end in itertools.pairwise(bounds)]
    return Splits(*([e for key in part for e in groups[key]] for part in parts))
