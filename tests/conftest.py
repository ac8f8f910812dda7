"""Fixtures and hooks shared across test folders."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``longest`` first: run in two processes (pyproject's addopts), the rest of the suite then runs
    beside them instead of after them."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[None]:
    """A 2-CPU Ray cluster for a module (mark it ``xdist_group("ray")``: one cluster at a time on the machine); its
    workers import the tests' tools from the repository."""
    ray = pytest.importorskip("ray")
    root = Path(__file__).resolve().parents[1]
    ray.init(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": str(root)}}, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for tests that run tiny models: their ops are too small to split, and on a busy 2-core
    machine two threads waiting on each other made such tests ten times slower."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def offline_in_a_fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Reading a local file reaches no network (no hub), and caches under this test's own folder."""
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path / "cache"))

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("reading a local file must not reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
