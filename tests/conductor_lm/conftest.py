"""A fresh tiny policy per test (tests train it); the whole folder is skipped without torch and peft."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.conductor_lm import ConductorLM  # noqa: E402


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model's ops are too small to split, and on a busy 2-core machine two threads
    waiting on each other made these tests ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny() -> ConductorLM:
    return ConductorLM.tiny(seed=0)
