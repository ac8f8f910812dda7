"""A server process's garbage collector (``tune_gc_for_serving``), checked in a fresh interpreter: the tuning is
process-wide, and this test process must keep Python's defaults."""

import json
import subprocess
import sys
from pathlib import Path

from conductor.deploy.server._collector import YOUNG_COLLECTION_EVERY

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, json
from conductor.deploy import tune_gc_for_serving
before = {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}
tune_gc_for_serving()
print(json.dumps({"before": before, "after": {"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold()}}))
"""


def test_tuning_freezes_what_the_process_holds_and_collects_young_objects_less_often():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    before, after = seen["before"], seen["after"]
    assert before["frozen"] == 0 and after["frozen"] > 10_000  # the imports' objects, out of every collection's walk
    assert after["threshold"] == [YOUNG_COLLECTION_EVERY, *before["threshold"][1:]]
