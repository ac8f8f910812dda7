"""Hostile programs against the Python tool: every one is contained.

Each program runs twice: as shipped (bubblewrap sandbox plus the audit hook) and with the audit hook removed, so the
OS-level sandbox is shown to hold on its own. After each run: the tool answered (text, or a ``WorkerError``), this
process is alive, nothing appeared outside the sandbox, the parent's secret didn't leak, and nothing the program
started is still running. Programs use these placeholders: SENTINEL (a path under the test's own tmp dir), MARKER (a
unique word the program puts in file names and command lines), HOSTPID (this process's pid), PORT (a TCP server of
the test), SOCKPATH (a Unix socket of the test), SECRET_NAME (a variable set in this process's environment).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

import conductor
from conductor.errors import WorkerError
from conductor.modules.tools import PythonWorker, _sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (scripts/setup.sh installs it)")

SPAWN_SH = "['/bin/sh', '-c', 'echo x > SENTINEL; sleep 30; : MARKER']"

HOSTILE = {
    # ---- processes, through every API -------------------------------------------------------------------------------
    "subprocess": f"import subprocess\nsubprocess.run({SPAWN_SH})",
    "subprocess-sys-audit-patched": f"import subprocess, sys\nsys.audit = lambda *a: None\nsubprocess.run({SPAWN_SH})",
    "os.system": "import os\nos.system('echo x > SENTINEL; sleep 30; : MARKER')",
    "os.popen": "import os\nprint(os.popen('echo x > SENTINEL; sleep 30; : MARKER').read())",
    "os.fork": "import os, time\nif os.fork() == 0:\n    open('SENTINEL', 'w').write('x')\n    time.sleep(30)",
    "pty.fork": "import pty, time\nif pty.fork()[0] == 0:\n    time.sleep(30)",
    "os.posix_spawn": f"import os\nos.posix_spawn('/bin/sh', {SPAWN_SH}, {{}})",
    "os.spawnv": f"import os\nos.spawnv(os.P_NOWAIT, '/bin/sh', {SPAWN_SH})",
    "os.execv": f"import os\nos.execv('/bin/sh', {SPAWN_SH})",
    "_posixsubprocess.fork_exec": (
        "import _posixsubprocess, os, subprocess, sys\n"
        "args = [b'/bin/sh', b'-c', b'echo x > SENTINEL; sleep 30; : MARKER']\n"
        "r, w = os.pipe()\n"
        "extra = (None, False) if sys.version_info < (3, 12) else (False,)\n"
        "pid = _posixsubprocess.fork_exec(args, [b'/bin/sh'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w,\n"
        "                                  True, True, -1, None, None, None, -1, *extra)\n"
        "print('spawned', pid)"
    ),
    "ctypes-libc-fork": (
        "import ctypes, time\nlibc = ctypes.CDLL(None)\n"
        "if libc.fork() == 0:\n    open('SENTINEL', 'w').write('x')\n    time.sleep(30)"
    ),
    "ctypes-raw-clone-syscall": (
        "import ctypes, platform, signal, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "clone = 56 if platform.machine() == 'x86_64' else 220\n"
        "pid = libc.syscall(clone, int(signal.SIGCHLD), 0, 0, 0)\n"
        "if pid == 0:\n    time.sleep(30)\nprint('clone', pid, ctypes.get_errno())"
    ),
    "ctypes-libc-execve": (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "argv = (ctypes.c_char_p * 4)(b'/bin/sh', b'-c', b'echo x > SENTINEL; sleep 30; : MARKER', None)\n"
        "print(libc.execve(b'/bin/sh', argv, (ctypes.c_char_p * 1)(None)))"
    ),
    "multiprocessing": (
        "import multiprocessing, time\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.Process(target=time.sleep, args=(30,)).start()"
    ),
    "process-pool": (
        "from concurrent.futures import ProcessPoolExecutor\nprint(ProcessPoolExecutor(2).submit(abs, -1).result())"
    ),
    # ---- writes outside the sandbox, through any library ------------------------------------------------------------
    "open": "open('SENTINEL', 'w').write('x')",
    "os.open": "import os\nos.write(os.open('SENTINEL', os.O_CREAT | os.O_WRONLY), b'x')",
    "pathlib": "import pathlib\npathlib.Path('SENTINEL').write_text('x')",
    "shutil.copy": "import shutil\nshutil.copy('/usr/lib/os-release', 'SENTINEL')",
    "sqlite3": "import sqlite3\nsqlite3.connect('SENTINEL').execute('create table t (x)')",
    "os.mkfifo": "import os\nos.mkfifo('SENTINEL')",
    "tempfile-elsewhere": (
        "import os, tempfile\nprint(tempfile.mkstemp(dir=os.path.dirname('SENTINEL'), prefix='MARKER'))"
    ),
    "tempfile-in-tmp": (
        "import tempfile\nf = tempfile.NamedTemporaryFile(dir='/tmp', prefix='escape-MARKER', delete=False)"
    ),
    "os.link": "import os\nos.link('/usr/lib/os-release', 'SENTINEL')",
    "os.symlink": "import os\nos.symlink('/', 'SENTINEL')",
    "patch-the-library": "import os\nopen(os.path.join('PACKAGE_DIR', 'MARKER.py'), 'w').write('import os')",
    "patch-site-packages": "import site\nopen(site.getsitepackages()[0] + '/MARKER.pth', 'w').write('import os')",
    "dev-shm-and-root": "for p in ('/dev/shm/MARKER', '/MARKER', '/usr/MARKER'):\n    open(p, 'w').write('x')",
    # ---- fifos and symlinks out ------------------------------------------------------------------------------------
    "fifo-then-symlink-out": (
        "import os\nos.mkfifo('escape-MARKER')\nos.symlink('SENTINEL', 'out')\nopen('out', 'w').write('x')"
    ),
    "symlink-through-proc-root": "import os\nos.symlink('/proc/1/root/SENTINEL', 'out')\nopen('out', 'w').write('x')",
    "relative-climb": "open('../' * 20 + 'SENTINEL'.lstrip('/'), 'w').write('x')",
    # ---- sockets -----------------------------------------------------------------------------------------------------
    "tcp-to-the-host": "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=1).sendall(b'MARKER')",
    "tcp-listen": "import socket\ns = socket.create_server(('0.0.0.0', 0))\nprint('listening', s.getsockname())",
    "udp-dns": "import socket\nprint(socket.getaddrinfo('example.com', 80))",
    "unix-socket": "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('SOCKPATH')\ns.sendall(b'MARKER')",
    "abstract-unix-socket": (
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0conductor-ABSTRACT')\ns.sendall(b'MARKER')"
    ),
    # ---- other processes' /proc --------------------------------------------------------------------------------------
    "parent-environ": "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())",
    "parent-cmdline": "import os\nprint(open(f'/proc/{os.getppid()}/cmdline').read())",
    "host-pids-environ": "for pid in (HOSTPID, HOLDERPID):\n    print(open(f'/proc/{pid}/environ').read())",
    "every-environ": (
        "import glob, os\nprint(os.environ)\n"
        "for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/task/*/environ'):\n"
        "    try:\n        print(path, open(path, 'rb').read())\n    except OSError as exc:\n        print(path, exc)"
    ),
    "env-var-by-name": "import os\nprint(os.environ.get('SECRET_NAME'), os.getenv('SECRET_NAME'))",
    # ---- signalling the parent ---------------------------------------------------------------------------------------
    "os.kill-parent": "import os\nos.kill(os.getppid(), 9)\nos.kill(1, 9)",
    "os.kill-host-pid": "import os\nos.kill(HOSTPID, 9)",
    "os.killpg": "import os\nos.killpg(os.getpgid(os.getppid()), 9)\nos.killpg(HOSTPID, 9)",
    "kill-everyone": "import os\nos.kill(-1, 9)",
    "pidfd_send_signal": "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)",
    "pidfd-host-pid": "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(HOSTPID), 9)",
    "ctypes-kill": "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.kill(HOSTPID, 9), libc.kill(-1, 9))",
    # ---- tampering with the guards -----------------------------------------------------------------------------------
    "audit-hook-off-via-gc": (
        "import gc, os\n"
        "for f in gc.get_objects():\n"
        "    if type(f).__name__ == 'function' and f.__name__ == 'guard':\n"
        "        f.__code__ = (lambda event, args: None).__code__\n"
        "os.system('echo x > SENTINEL; sleep 30; : MARKER')"
    ),
    "audit-hook-off-via-frames": (
        "import sys, os\nframe = sys._getframe()\n"
        "while frame.f_back:\n    frame = frame.f_back\n"
        "frame.f_globals.get('BLOCKED', set()).__class__\n"
        "frame.f_globals['guard'].__code__ = (lambda event, args: None).__code__ if 'guard' in frame.f_globals else 0\n"
        "os.system('echo x > SENTINEL; sleep 30; : MARKER')"
    ),
    "raise-the-limits": (
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (-1, -1))\nx = bytearray(2**33)"
    ),
    "new-user-namespace": ("import ctypes, os\nprint(ctypes.CDLL(None).unshare(0x10000000), 'unshared')\nos.fork()"),
    "remount-writable": (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "print(libc.mount(b'none', b'/', None, 0x20 | 0x1000, None))\nopen('/MARKER', 'w').write('x')"
    ),
    "ptrace-pid-1": "import ctypes\nprint(ctypes.CDLL(None).ptrace(16, 1, 0, 0))",
    # ---- processes that outlive the run ------------------------------------------------------------------------------
    "setsid-double-fork": (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(30)\n    os._exit(0)\n"
        "print('parent done')"
    ),
    "ignore-signals-and-sleep": (
        "import signal, time\nfor s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\ntime.sleep(30)"
    ),
    "exec-a-long-sleep": "import os\nos.execv('/bin/sleep', ['MARKER', '30'])",
    "non-daemon-threads": (
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\nprint('main done')"
    ),
    # ---- bombs and floods ------------------------------------------------------------------------------------------
    "fork-bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "thread-bomb": (
        "import threading, time\nwhile True:\n"
        "    try:\n        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "    except RuntimeError:\n        pass"
    ),
    "memory-bomb": "x = []\nwhile True:\n    x.append(bytearray(2**24))",
    "memory-one-block": "x = bytearray(2**36)",
    "disk-bomb": "i = 0\nwhile True:\n    open(f'MARKER-{i}', 'wb').write(b'x' * 2**22)\n    i += 1",
    "one-huge-file": "with open('MARKER', 'wb') as f:\n    while True:\n        f.write(b'x' * 2**22)",
    "stdout-flood": "while True:\n    print('x' * 10000)",
    "stderr-flood": "import sys\nwhile True:\n    sys.stderr.write('x' * 10000)",
    "cpu-spin-in-threads": (
        "import threading\ndef spin():\n    while True:\n        pass\n"
        "for _ in range(4):\n    threading.Thread(target=spin).start()"
    ),
    "deep-recursion": "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nf(0)",
}


@pytest.fixture(params=["as-shipped", "without-audit-hook"])
def layers(request, monkeypatch) -> str:
    if request.param == "without-audit-hook":
        monkeypatch.setattr(_sandbox, "_AUDIT_HOOK", "")
    return request.param


@pytest.fixture
def secret() -> str:
    """A fake API key in this process's environment and in that of another process (HOLDERPID) of the test."""
    return f"s3cret-{uuid.uuid4().hex}"


@pytest.fixture
def secret_holder(secret, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOSTILE_SECRET", secret)
    # Changes to os.environ don't show in /proc/<pid>/environ, so a process started with the secret stands in for a
    # server that was started with its keys in the environment.
    holder = subprocess.Popen(["/bin/sleep", "60"], env={"CONDUCTOR_HOSTILE_SECRET": secret})
    yield holder.pid
    holder.kill()
    holder.wait()


@pytest.fixture
def host_listeners():
    """A TCP server, a Unix socket and an abstract Unix socket on the host, each must see no connection."""
    tcp = socket.create_server(("127.0.0.1", 0))
    unix_dir = Path(f"/tmp/conductor-hostile-{uuid.uuid4().hex[:8]}")
    unix_dir.mkdir()
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_dir / "sock"))
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"conductor-{uuid.uuid4().hex}"
    abstract.bind("\0" + abstract_name)
    for server in (tcp, unix, abstract):
        server.listen()
        server.setblocking(False)
    yield {"PORT": str(tcp.getsockname()[1]), "SOCKPATH": str(unix_dir / "sock"), "ABSTRACT": abstract_name}
    for server in (tcp, unix, abstract):
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
        server.close()
    shutil.rmtree(unix_dir)


def _processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        uids = proc.info["uids"]
        if marker in cmdline or (uids and _sandbox._SANDBOX_UID in uids):
            found.append(proc)
    return found


def _wait_until_gone(before: set[int], marker: str) -> tuple[set[int], list[psutil.Process]]:
    """Processes started since ``before`` (children of this one) and ones carrying ``marker``, after a short grace."""
    deadline = time.monotonic() + 3
    while True:
        children = {p.pid for p in psutil.Process().children(recursive=True)} - before
        marked = _processes_with(marker)
        if (not children and not marked) or time.monotonic() > deadline:
            return children, marked
        time.sleep(0.05)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_program_is_contained(name, layers, tmp_path, secret, secret_holder, host_listeners) -> None:
    marker = f"MARK{uuid.uuid4().hex}"
    sentinel = tmp_path / "escaped"
    before_files = set(tmp_path.iterdir())
    replacements = {
        "SENTINEL": str(sentinel),
        "MARKER": marker,
        "HOSTPID": str(os.getpid()),
        "HOLDERPID": str(secret_holder),
        "SECRET_NAME": "CONDUCTOR_HOSTILE_SECRET",
        "PACKAGE_DIR": os.path.dirname(conductor.__file__),
        **host_listeners,
    }
    code = HOSTILE[name]
    for placeholder, value in replacements.items():
        code = code.replace(placeholder, value)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    worker = PythonWorker(code_timeout_s=1.5, memory_mb=256, max_output_chars=2000, timeout_s=10)

    try:
        answer = worker.complete(
            [{"role": "user", "content": f"```python\n{code}\n```"}], max_tokens=800, temperature=0
        )
        said = answer.text
    except WorkerError as exc:  # an error is a fine answer; anything else would escape the worker
        said = str(exc)

    assert secret not in said
    assert psutil.Process().is_running()
    assert not sentinel.exists() and not sentinel.is_symlink()
    assert set(tmp_path.iterdir()) == before_files
    outside = [*glob.glob(f"/tmp/*{marker}*"), *glob.glob(f"/tmp/escape-{marker}*"), *glob.glob(f"/{marker}*")]
    outside += glob.glob(os.path.join(os.path.dirname(conductor.__file__), f"{marker}*"))
    outside += glob.glob(f"/dev/shm/{marker}*") + glob.glob(f"/usr/{marker}*")
    assert outside == []
    children, marked = _wait_until_gone(before, marker)
    assert children == set(), f"left running: {children}"
    assert marked == [], f"left running: {marked}"


def test_there_are_at_least_forty_hostile_programs() -> None:
    assert len(HOSTILE) >= 40


def test_the_secret_can_be_read_without_the_sandbox(secret, secret_holder) -> None:
    """The checks above mean something: unisolated, the same program reads the secret."""
    code = HOSTILE["host-pids-environ"].replace("HOSTPID", str(os.getpid())).replace("HOLDERPID", str(secret_holder))
    assert secret in _sandbox.run_python(code, timeout_s=5, isolation="none")
    assert secret not in _sandbox.run_python(code, timeout_s=5)
