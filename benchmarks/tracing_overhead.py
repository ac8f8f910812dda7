"""What does tracing add to each step? The executor's overhead per one-step run with tracing off, then on.

"On" writes every span to a JSON-lines file through the SDK's batch processor (``enable_tracing(file=...)``). Uses
``executor_overhead.measure``, so the "off" row is directly comparable with ``benchmarks/executor_overhead.py``.

    .venv/bin/python benchmarks/tracing_overhead.py [--n 2000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from executor_overhead import measure

from conductor.modules import disable_tracing, enable_tracing
from conductor.testing import ScriptedWorker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    worker = ScriptedWorker("scripted", lambda _: "42")
    print(f"{'tracing':<8} {'direct (µs)':>12} {'executor (µs)':>14} {'overhead (µs)':>14}")
    with tempfile.TemporaryDirectory() as folder:
        for label in ("off", "on", "off"):
            if label == "on":
                enable_tracing(file=Path(folder) / "spans.jsonl")
            direct, through = measure(worker, "Answer.", args.n)
            disable_tracing()
            print(f"{label:<8} {direct * 1e6:>12.1f} {through * 1e6:>14.1f} {(through - direct) * 1e6:>14.1f}")


if __name__ == "__main__":
    main()
