"""benchmarks/server_load.py end to end at a tiny scale: both apps, two processes on one socket, every request answered
with the stub's answer, and the figures written for the README. Slow: it starts four Python processes (about 30 s
on a busy 2-core machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_tiny_load_is_answered_in_full_by_both_apps(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    command = [sys.executable, "benchmarks/server_load.py", "--concurrency", "4", "--requests", "6"]
    command += ["--worker-delay", "0.05", "--processes", "2", "--json", str(figures_file)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    levels = json.loads(figures_file.read_text())["levels"]
    assert [(level["app"], level["processes"], level["concurrency"]) for level in levels] == [
        ("conductor", 2, 4),
        ("starlette", 2, 4),
    ]
    for level in levels:
        assert (level["requests"], level["lost"], level["failed"]) == (6, 0, 0), level
        assert level["throughput"] > 0 and level["p99_overhead_ms"] is not None, level
    assert "CPU per request, conductor / bare app, 2 process(es) at 4 concurrent" in done.stdout
