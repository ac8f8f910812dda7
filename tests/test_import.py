"""``import conductor`` changes nothing process-wide: the user's environment is theirs (litellm's offline price
table is asked for during litellm's own import only)."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import os
before = dict(os.environ)
import conductor, litellm
assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
assert litellm.model_cost, "litellm has its packaged price table"
print("ok")
"""


def test_import_conductor_leaves_the_environment_unchanged() -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root"}  # no LITELLM_* set by the caller
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_a_setting_the_user_made_is_kept() -> None:
    code = "import os; import conductor; print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])"
    env = {"PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "False"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.stdout.strip() == "False", result.stderr[-2000:]
