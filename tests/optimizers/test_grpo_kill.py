"""A training run killed with SIGKILL between checkpoints resumes to the very adapter an uninterrupted run ends with.

The run (``test_grpo_helpers.main``: 5 steps, a checkpoint every 2, randomised pools, groups that agree resampled)
starts in a subprocess and is killed as soon as its first checkpoint (step 2) is complete, so step 3 is in progress
and lost. Resuming continues from step 2 and recomputes step 3 exactly: every random choice is seeded from ``(seed,
step)``, the checkpoint holds the weights, the optimizer and the schedule, and its metrics say how many examples the
steps drew (resampling draws extra), so step 3 draws the same ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.optimizers.grpo import checkpoints  # noqa: E402
from tests.optimizers.test_grpo_helpers import KILL_TEST_RUN, _one_torch_thread, trainer  # noqa: E402, F401

ROOT = Path(__file__).resolve().parents[2]


def _start(output_dir: Path, resume: bool) -> subprocess.Popen:
    command = [sys.executable, "-m", "tests.optimizers.test_grpo_helpers", str(output_dir), "resume" if resume else ""]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def test_a_run_killed_between_checkpoints_resumes_to_the_same_adapter(tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    run = _start(killed, resume=False)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step-00000002").is_dir():
        assert run.poll() is None, f"the run ended before its first checkpoint:\n{run.stderr.read()}"
        assert time.monotonic() < deadline, "no checkpoint within 5 minutes"
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL
    assert [p.name for p in checkpoints(killed)] == ["step-00000002"]  # killed before step 4's checkpoint

    resumed = _start(killed, resume=True)
    _, errors = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, errors

    straight = trainer(tmp_path / "straight", **KILL_TEST_RUN)
    straight.run()
    expected, got = _adapter(tmp_path / "straight" / "policy"), _adapter(killed / "policy")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)  # bitwise: the lost step 3 was redone exactly
    metrics = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 6))
    assert metrics[0]["resampled_groups"] > 0  # so step 3 starts past the examples the first steps drew
