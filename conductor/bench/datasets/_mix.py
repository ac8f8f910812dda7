"""A mix of benchmarks in one list, for training and evaluating on several task families at once."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from conductor._imports import import_object
from conductor.bench.datasets._splits import Splits, split
from conductor.errors import ConfigError


def load_mix(sources: Sequence[Mapping[str, Any]], seed: int = 0) -> list[dspy.Example]:
    """``n`` examples drawn at random (seeded) from each source, dealt in turn (a, b, a, b, ...).

    Each source is ``{"loader": "module:function", "args": {...}, "n": 50}``; score the mix with
    ``conductor.bench.datasets:metric``, which picks each example's metric by its ``family``. A random draw,
    not the first ``n``: loaders return benchmark order, which is grouped (MMLU by subject, BIG-bench arithmetic by
    digit count). A source with ``"part": "train"`` (or ``"val"``, ``"test"``) draws from that part of the source's
    seeded split (``split``, seed ``"split_seed"``, default 0), the part ``conductor bench`` takes it from: training
    on the bench's train part never sees its test questions.
    """
    if not sources:
        raise ConfigError("load_mix needs at least one source")
    drawn = []
    for position, source in enumerate(sources):
        unknown = set(source) - {"loader", "args", "n", "part", "split_seed"}
        if "loader" not in source or "n" not in source or unknown:
            raise ConfigError(
                f"source {position} must have `loader` and `n` (and may have `args`, `part`, `split_seed`), not "
                f"{dict(source)}"
            )
        examples = list(import_object(source["loader"])(**source.get("args", {})))
        if "part" in source:
            if source["part"] not in Splits._fields:
                raise ConfigError(f"source {position}: part must be one of {Splits._fields}, not {source['part']!r}")
            examples = getattr(split(examples, source.get("split_seed", 0)), source["part"])
        if len(examples) < source["n"]:
            raise ConfigError(f"source {position} ({source['loader']}) has {len(examples)} examples, not {source['n']}")
        drawn.append(random.Random(f"{seed}:{position}").sample(examples, source["n"]))
    return [e for row in itertools.zip_longest(*drawn) for e in row if e is not None]
