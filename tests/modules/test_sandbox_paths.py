"""The Python tool works wherever the interpreter lives: here a virtual environment under ``/tmp`` (a pytest
``tmp_path``), which the sandbox's own ``/tmp`` used to hide (``bwrap: execvp ...: No such file or directory``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
from conductor.modules.tools import PythonWorker
prompt = [{"role": "user", "content": "```python\\nprint(6 * 7)\\n```"}]
print(PythonWorker("py").complete(prompt, max_tokens=20, temperature=0.0).text)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/setup.sh installs it)")
def test_the_python_tool_runs_with_an_interpreter_under_a_temporary_folder(tmp_path: Path) -> None:
    assert str(tmp_path).startswith("/tmp/"), tmp_path  # the case that failed
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = tmp_path / "venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])}
    result = subprocess.run([str(python), "-c", CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "42"
