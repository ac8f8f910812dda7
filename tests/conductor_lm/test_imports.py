"""The core package imports without torch, and this one names what is missing."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import importlib.util, sys
import conductor
assert "torch" not in sys.modules and "conductor.conductor_lm" not in sys.modules, "conductor imported torch"
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "peft" else real(name, *a)
try:
    import conductor.conductor_lm
except conductor.MissingDependency as exc:
    print(exc)
"""


def test_core_package_needs_no_torch_and_a_missing_dependency_is_named() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    assert "needs peft: pip install 'dspy-conductor[local]'" in result.stdout
