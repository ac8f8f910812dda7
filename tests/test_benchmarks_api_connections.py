"""benchmarks/api_connections.py end to end at a tiny scale: every run answered, and each row's calls a second and
the most the stub held at once printed."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_few_runs_at_once_are_all_answered_and_the_stub_sees_them_together():
    command = [sys.executable, "benchmarks/api_connections.py", "--in-flight", "2", "6", "--latency", "0.2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [(row[0], row[-1]) for row in rows] == [("2", "2"), ("6", "6")]  # in flight, the most at the stub at once
    assert all(0 < float(row[3]) <= 1.05 for row in rows)  # calls a second over the ideal
