"""The built wheel on its own: installed into a fresh virtual environment that sees the dependencies of ``.venv`` but
not this checkout, every command runs from a folder outside it (``conductor bench`` once read the repository's
``experiments/``, which no wheel holds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

LICENSE_FILES = "from importlib.metadata import files; print(*files('dspy-conductor'))"
pytestmark = pytest.mark.slow  # builds a wheel and a virtual environment: about a minute


def run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(list(map(str, command)), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(tmp: Path) -> Path:
    """The wheel of this checkout, built in ``tmp``."""
    source = tmp / "source"  # a copy, so the build writes nothing into the checkout
    shutil.copytree(ROOT / "conductor", source / "conductor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", source, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("dspy_conductor-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of a new environment with only the wheel installed from this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    env = tmp / "env"
    venv.create(env, with_pip=False)
    bin_dir = env / ("Scripts" if os.name == "nt" else "bin")
    env_python = bin_dir / "python"
    site = Path(run(env_python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp).stdout.strip())
    # The dependencies of .venv, as a plain path: its .pth files (the checkout's editable finder) are not processed.
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(sys.executable, "-m", "pip", "--python", env_python, "install", "--no-deps", "--no-index", wheel, cwd=tmp)
    return bin_dir


def test_the_installed_package_is_the_wheels(installed: Path, tmp_path: Path) -> None:
    code = "import conductor; print(conductor.__file__, conductor.__version__)"
    path, version = run(installed / "python", "-c", code, cwd=tmp_path).stdout.split()
    assert Path(path).is_relative_to(installed.parent)  # not the checkout, through .venv's editable install
    assert f'__version__ = "{version}"' in (ROOT / "conductor" / "_version.py").read_text()
    assert (Path(path).parent / "py.typed").is_file()  # type checkers read the package's annotations
    licence = run(installed / "python", "-c", LICENSE_FILES, cwd=tmp_path).stdout.split()
    assert any(name.endswith("LICENSE") for name in licence), licence  # the licence travels inside the wheel
    trained = run(installed / "python", "-c", "import conductor.deploy as d; print(d.TRAINED_PROGRAM)", cwd=tmp_path)
    assert (Path(trained.stdout.strip()) / "manifest.json").is_file()  # the shipped program is package data


def test_bench_runs_a_config_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    config = {
        "title": "Wheel check",
        "pool": {"simulated": {"models": ["gpt-5", "gemma-3-27b"]}},
        "datasets": [{"name": "simulated", "args": {"family": "math500"}, "n": 3}],
        "methods": [
            {"name": "single", "type": "single", "args": {"worker": 0}},
            {"name": "random", "type": "random", "args": {"max_steps": 2}},
        ],
        "output": "results",
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(config))
    result = run(installed / "conductor", "bench", "bench.yaml", "--no-progress", cwd=tmp_path)
    assert "SIMULATED: Wheel check" in result.stdout and "6 units" in result.stdout
    assert {"table.md", "results.json"} <= {p.name for p in (tmp_path / "results").iterdir()}


def test_train_help_runs_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    result = run(installed / "conductor", "train", "--help", cwd=tmp_path)
    assert "usage: conductor train" in result.stdout and "--resume" in result.stdout
