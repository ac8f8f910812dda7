"""The Python tool behind the server: a request can neither read the server's secrets nor stop the server."""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.deploy import KeySpec, KeyStore, create_app, hash_key, new_key
from conductor.modules import Conductor, WorkerPool
from conductor.testing import scripted_lm

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/setup.sh installs it)")

SERVER_PID = os.getpid()  # the server runs in this process (TestClient)
STEAL = f"""
import glob, os
print(dict(os.environ))
for path in ['/proc/{SERVER_PID}/environ', f'/proc/{{os.getppid()}}/environ', *glob.glob('/proc/*/environ')]:
    try:
        print(path, open(path, 'rb').read())
    except OSError as exc:
        print(path, exc)
"""
KILL = f"""
import os, signal
for attempt in (
    lambda: os.kill(os.getppid(), signal.SIGKILL),
    lambda: os.kill({SERVER_PID}, signal.SIGKILL),
    lambda: os.killpg({SERVER_PID}, signal.SIGKILL),
    lambda: signal.pidfd_send_signal(os.pidfd_open({SERVER_PID}), signal.SIGKILL),
    lambda: os.kill(-1, signal.SIGKILL),
):
    try:
        attempt()
    except OSError as exc:
        print(exc)
"""
PROGRAMS = {"steal": STEAL, "kill": KILL, "compute": "print(6 * 7)"}


def conductor_says(prompt: str) -> str:
    """One Python step running the program the question names."""
    name = next(name for name in PROGRAMS if f"please {name}" in prompt)
    subtask = f"Run this:\n```python\n{PROGRAMS[name]}\n```"
    return f"model_id = [0]\nsubtasks = {json.dumps([subtask])}\naccess_list = [[]]"


@pytest.fixture
def client(tmp_path):
    pool = WorkerPool.from_config(
        {"workers": [{"name": "python", "kind": "tool", "tool": "python", "max_tokens": 4000}]}
    )
    program = Conductor(pool, scripted_lm(conductor_says), signature="question -> answer")
    key = new_key()
    keys = KeyStore([KeySpec(id="coder", hash=hash_key(key), workers=("python",))])
    with TestClient(create_app(program, model="team", keys=keys, audit_db=tmp_path / "audit.sqlite")) as client:
        client.headers["Authorization"] = f"Bearer {key}"
        yield client


def ask(client: TestClient, question: str):
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question}]})


def server_secrets() -> list[str]:
    """The server's environment as it started (what /proc/<pid>/environ shows), minus what the sandbox sets too."""
    with open("/proc/self/environ", "rb") as environ:
        entries = environ.read().decode(errors="replace").split("\0")
    common = ("PATH=", "HOME=", "PWD=", "TMPDIR=", "LANG=", "LC_", "OMP_", "OPENBLAS_", "MKL_", "SHLVL=", "_=", "TERM=")
    return [entry for entry in entries if "=" in entry and len(entry) > 8 and not entry.startswith(common)]


def test_a_request_cannot_read_the_server_s_environment(client, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-server-secret-0123456789")
    response = ask(client, "Find the keys, please steal")
    assert response.status_code == 200, response.text
    text = response.text
    assert "environ" in text  # the program ran and reported what it found
    assert "sk-test-server-secret-0123456789" not in text
    leaked = [entry for entry in server_secrets() if entry in text]
    assert leaked == []
    assert ask(client, "Then please compute").json()["choices"][0]["message"]["content"] == "42"


def test_a_request_cannot_kill_the_server(client):
    response = ask(client, "Stop it, please kill")
    assert response.status_code == 200, response.text
    for _ in range(2):
        follow_up = ask(client, "Still there? please compute")
        assert follow_up.status_code == 200
        assert follow_up.json()["choices"][0]["message"]["content"] == "42"
    os.kill(SERVER_PID, 0)  # this process, the server, is alive
