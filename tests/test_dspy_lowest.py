"""The lower end of the dspy range pyproject declares: the tests that touch dspy, run again on the oldest dspy allowed.

A venv holding only that dspy sees .venv's packages behind it, so everything but dspy is what the main run uses. The
tests of the sandboxed Python tool stay out (``-k "not sandbox"``): the sandbox mounts only the running interpreter's
own installation, not .venv's packages behind it.
"""

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/modules/test_dspy_native.py",
    "tests/modules/test_worker.py",
    "tests/modules/test_conductor.py",
    "tests/local",
    "tests/conductor_lm/test_engine.py",
    "tests/deploy/test_artifact.py",
    "tests/optimizers/test_prompt_search.py",
]


def lowest_dspy() -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in dependencies if d.startswith("dspy")]
    return spec.split(">=")[1].split(",")[0]


@pytest.mark.slow
def test_the_dspy_tests_pass_on_the_oldest_dspy_allowed(tmp_path):
    version = lowest_dspy()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    base = sysconfig.get_paths()["purelib"]
    (Path(site) / "_dspy_conductor_base.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    subprocess.run([*install, "--target", site, f"dspy=={version}"], check=True)
    found = subprocess.run([python, "-c", "import dspy; print(dspy.__version__)"], capture_output=True, text=True)
    assert found.stdout.strip() == version
    options = ["-q", "-n", "0", "-m", "not slow", "-k", "not sandbox", "-p", "no:cacheprovider"]  # -n 0: one process
    run = subprocess.run(
        [python, "-m", "pytest", *options, *TESTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
