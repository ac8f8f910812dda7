"""benchmarks/gpu_step.py at SmolLM2's shape on the CPU: the code that measured the GPU recipe's step on an H200 runs,
and reports a decode step, learner throughput for both base dtypes and the recipe step each implies. Slow: it builds
two random 135M models (about 15 s)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
PROJECTIONS = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
LORA_PARAMETERS = 30 * sum(16 * (fan_in + fan_out) for fan_in, fan_out in PROJECTIONS)
"""r=16 on q, k, v, o, gate, up and down of SmolLM2's 30 layers: the recipe's adapter, counted by hand."""


@pytest.mark.slow
def test_the_gpu_step_benchmark_runs_small_on_the_cpu(tmp_path: Path) -> None:
    figures_file = tmp_path / "figures.json"
    command = [sys.executable, "benchmarks/gpu_step.py", "--shape", "smollm2-135m", "--device", "cpu"]
    command += ["--group", "2", "--prompt-tokens", "16", "--new-tokens", "20", "--update-tokens", "16"]
    command += ["--update-rows", "1", "--repeats", "1", "--json", str(figures_file)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    figures = json.loads(figures_file.read_text())
    assert figures["device"] == "CPU" and figures["shape"] == "smollm2-135m"
    assert figures["decode_bf16"]["step_ms"] > 0
    for base in ("update_bf16_base", "update_float32_base"):
        update = figures[base]
        assert update["tokens_per_s"] > 0 and update["recipe_step_s"] > 0, update
        assert update["lora_parameters"] == LORA_PARAMETERS, update


def test_without_a_gpu_the_default_device_is_refused_with_a_way_out() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_step.py"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "--device cpu --shape smollm2-135m" in done.stderr
