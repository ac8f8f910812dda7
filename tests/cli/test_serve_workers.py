"""``conductor serve --workers N``: several processes on one port, one audit log, one spend ledger."""

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conductor.cli import main
from conductor.deploy import AuditLog, save_program
from tests.deploy.helpers import compiled_program

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_processes(pid: int) -> int:
    """How many of ``pid``'s child processes are multiprocessing's spawned ones (uvicorn's workers)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return sum(b"spawn_main" in Path(f"/proc/{kid}/cmdline").read_bytes() for kid in kids)


@pytest.mark.slow
def test_two_server_processes_answer_into_one_audit_log_and_keep_a_key_s_daily_budget(tmp_path, capsys):
    folder = save_program(compiled_program(), tmp_path / "math-team")
    keys, db, port = tmp_path / "keys.yaml", tmp_path / "audit.sqlite", free_port()
    limits = ["--max-tokens", "1000", "--daily-tokens", "6000"]  # a request reserves 1,000 and spends about 300
    assert main(["keys", "add", "--file", str(keys), "--id", "ops", *limits]) == 0
    key = capsys.readouterr().out.strip()
    command = [sys.executable, "-c", "from conductor.cli import main; raise SystemExit(main())", "serve", str(folder)]
    command += ["--workers", "2", "--port", str(port), "--keys", str(keys), "--audit-db", str(db), "--trust-code"]
    server = subprocess.Popen(command, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()
            try:
                if httpx.get(f"{url}/health").status_code == 200 and server_processes(server.pid) == 2:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)

        def ask(_):
            body = {"messages": [{"role": "user", "content": "What is 17 * 23 + 4?"}]}
            return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})

        with ThreadPoolExecutor(8) as threads:
            responses = list(threads.map(ask, range(40)))
    finally:
        server.terminate()
        server.wait(30)
    answered = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert {r.json()["choices"][0]["message"]["content"] for r in answered} == {"395"}
    assert answered and refused and {r.status_code for r in refused} == {429}
    rows = AuditLog(db).read()
    assert len(rows) == 40 and sum(row["outcome"] == "ok" for row in rows) == len(answered)
    spent = sum(row["prompt_tokens"] + row["completion_tokens"] for row in rows if row["outcome"] == "ok")
    assert spent <= 6000


def test_the_shared_socket_is_tcp_so_connections_get_nodelay_and_a_taken_port_is_a_clear_error():
    from conductor.cli._serve import listening_socket
    from conductor.errors import ConfigError

    with listening_socket("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY only on sockets that say so
        sock.listen()
        with pytest.raises(ConfigError, match=r"can't listen on 127\.0\.0\.1:"):
            listening_socket("127.0.0.1", sock.getsockname()[1])
