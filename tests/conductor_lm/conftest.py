"""A fresh tiny policy per test (tests train it); the whole folder is skipped without torch and peft."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.conductor_lm import ConductorLM  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs with one torch thread (see tests/conftest.py)."""


@pytest.fixture
def tiny() -> ConductorLM:
    return ConductorLM.tiny(seed=0)
