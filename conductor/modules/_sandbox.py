"""A sandboxed Python runner and the worker that runs the code in its prompt.

The code runs in a separate process with wall-clock, CPU, memory, file-size and output limits, in a fresh temporary
folder, with an audit hook that refuses network access, new processes and writes outside that folder. This guards
against accidents and naive code; it is not a security boundary against a determined attacker: run untrusted code
in a container.
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from conductor.errors import CodeTimeout, ToolInputError
from conductor.modules._tools import TRUNCATED, ToolWorker

_MAX_FILE_BYTES = 64 * 2**20
_STDERR_TAIL_LINES = 20
_STDERR_TAIL_CHARS = 2000

# Runs in the child with ``python -I -B -u -c``: limits itself, reads the program from stdin, installs the audit hook,
# then runs the program as ``__main__``. Tracebacks show the program's own lines, without the bootstrap's frame.
# ctypes may be imported (numpy and sympy do at import, opening only the process itself) but can't open libraries,
# look up or call C functions, or read raw memory.
_BOOTSTRAP = r"""
import linecache, os, resource, socket, sys, traceback, types

# No RLIMIT_NPROC: it counts every process of the user, not this tree's; the audit hook refuses new processes instead.
for kind, value in ((resource.RLIMIT_AS, int(sys.argv[1])), (resource.RLIMIT_CPU, int(sys.argv[2])),
                    (resource.RLIMIT_FSIZE, int(sys.argv[3])), (resource.RLIMIT_CORE, 0)):
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    # The CPU limit's hard value is a second later, so the soft one sends SIGXCPU (reported) before SIGKILL.
    resource.setrlimit(kind, (value, value + 1 if kind == resource.RLIMIT_CPU and value != hard else value))

source = sys.stdin.buffer.read().decode("utf-8", "replace")
sys.argv = ["<code>"]
linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
root = os.path.realpath(os.getcwd())

BLOCKED = frozenset({
    "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "subprocess.Popen",
    "os.kill", "os.killpg", "resource.setrlimit", "resource.prlimit",
    "ctypes.dlsym", "ctypes.call_function", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at",
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo", "socket.sethostname",
})
PATH_EVENTS = frozenset({
    "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree",
})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def inside(path):
    try:
        full = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return full == root or full.startswith(root + os.sep) or full == os.devnull


def guard(event, args):
    if (
        event in BLOCKED
        or (event == "socket.__new__" and args[1] != socket.AF_UNIX)
        or (event == "ctypes.dlopen" and args[0] is not None)
    ):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and not isinstance(args[0], int):
        writes = any(c in (args[1] or "") for c in "wax+") or (args[2] or 0) & WRITE_FLAGS
        if writes and not inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {args[0]!r}")
    elif event in PATH_EVENTS:
        for path in args[:2]:
            if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: {path!r}")


sys.addaudithook(guard)
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
try:
    code = compile(source, "<code>", "exec")
except (SyntaxError, ValueError) as exc:
    traceback.print_exception(type(exc), exc, None)
    sys.exit(1)
try:
    exec(code, main.__dict__)
except SystemExit:
    raise
except BaseException as exc:
    if isinstance(exc, MemoryError):
        main.__dict__.clear()  # free the program's data so the traceback can be printed
    traceback.print_exception(type(exc), exc, exc.__traceback__ and exc.__traceback__.tb_next)
    sys.exit(1)
"""


def _sandbox_env(workdir: str) -> dict[str, str]:
    """Nothing from the parent's environment but ``PATH``; home and temp files inside the sandbox; one BLAS thread,
    so numeric libraries don't reserve per-core buffers against the memory limit."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir, "TMPDIR": workdir}
    env.update(dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"))
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group. Called before the child is reaped, so its id can't be reused yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _collect(proc: subprocess.Popen, deadline: float, stdout_cap: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout and stderr until both close, stdout passes ``stdout_cap`` bytes, or the deadline passes.

    Returns (stdout, the tail of stderr, why it stopped early: None, "output" or "timeout"). Memory stays bounded
    whatever the program prints.
    """
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        selector.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is err:
                    del err[: -4 * _STDERR_TAIL_CHARS]
                elif len(out) > stdout_cap:
                    return bytes(out), bytes(err), "output"
    return bytes(out), bytes(err), None


def _exit_note(returncode: int, stderr: str, cpu_s: int, memory_mb: int) -> str:
    """What to say, after the output, about a program that failed: the end of its traceback, or how it was killed."""
    tail = "\n".join(stderr.rstrip().splitlines()[-_STDERR_TAIL_LINES:])[-_STDERR_TAIL_CHARS:]
    if returncode < 0:
        number = -returncode
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        if number == signal.SIGXCPU:
            reason = f"killed: CPU time limit ({cpu_s} s)"
        elif number in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            reason = f"killed by {name} (possibly the memory limit of {memory_mb} MB)"
        else:
            reason = f"killed by {name}"
        return f"{tail}\n{reason}" if tail else reason
    if "MemoryError" in tail:
        return f"{tail}\n(memory limit: {memory_mb} MB)"
    return tail or f"[exit status {returncode}]"


def run_python(code: str, *, timeout_s: float = 10.0, memory_mb: int = 512, max_output_chars: int = 10_000) -> str:
    """Run ``code`` in a separate Python process and return what it prints.

    The result is the program's stdout (cut at ``max_output_chars``, marked "[output truncated]"); when it fails,
    the end of its traceback or how it was killed follows, so an error in the code is an answer, not a
    ``WorkerError``. Only running past ``timeout_s`` raises (``WorkerTimeout``); the process group is killed first.

    The child runs ``python -I`` (no user site, no ``PYTHON*`` variables) in a fresh temporary directory, with an
    environment holding only ``PATH`` (plus ``HOME``/``TMPDIR`` pointing into that directory and one-thread BLAS
    settings), in its own session so the whole group can be killed, and with limits on address space
    (``memory_mb``), CPU time, file size (64 MB) and core dumps. An audit hook refuses network sockets, DNS lookups,
    starting processes (``subprocess``, ``os.system``, ``os.exec*``, ``fork``, ``posix_spawn``), signalling other
    processes, raising the limits, opening libraries or looking up C functions with ``ctypes``, and writing or
    deleting files outside the working directory.

    This guards against accidents and naive code, not against a determined attacker: audit hooks can be sidestepped
    from inside the interpreter. To run untrusted code, run the workers in a container or VM without network.
    """
    cpu_s = math.ceil(timeout_s) + 1
    with tempfile.TemporaryDirectory(prefix="conductor-python-", ignore_cleanup_errors=True) as workdir:
        command = [sys.executable, "-I", "-B", "-u", "-c", _BOOTSTRAP]
        command += [str(memory_mb * 2**20), str(cpu_s), str(_MAX_FILE_BYTES)]
        deadline = time.monotonic() + timeout_s
        # No preexec_fn (unsafe with threads, and workers are called from several): the bootstrap sets the limits.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_sandbox_env(workdir),
            start_new_session=True,
        )
        try:
            try:
                proc.stdin.write(code.encode("utf-8", "replace"))  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass  # the child died at start; its stderr says why
            out, err, stopped = _collect(proc, deadline, max_output_chars * 4)
        finally:
            _kill_group(proc)
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                with contextlib.suppress(BrokenPipeError):  # stdin may still hold code the child never read
                    stream.close()  # type: ignore[union-attr]
    if stopped == "timeout":
        raise CodeTimeout(f"the code ran past its time limit of {timeout_s:g} s and was stopped")
    text = out.decode("utf-8", "replace")
    truncated = stopped == "output" or len(text) > max_output_chars
    parts = [f"{text[:max_output_chars]}\n{TRUNCATED}" if truncated else text.rstrip("\n")]
    if proc.returncode != 0 and not truncated:
        parts.append(_exit_note(proc.returncode, err.decode("utf-8", "replace"), cpu_s, memory_mb))
    return "\n".join(p for p in parts if p) or "[no output]"


_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` tagged Python or untagged; else ``text`` itself if it parses as Python."""
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        raise ToolInputError("no Python code found: put it in a ```python fenced block") from None
    return text


class PythonWorker(ToolWorker):
    """Runs the Python code in its prompt (see ``extract_code``) with ``run_python`` and answers with what it prints.

    ``code_timeout_s`` limits one run; keep it below the worker's ``timeout_s`` (the executor's limit for the call),
    so the sandbox stops its own process and reports the timeout.
    """

    def __init__(
        self,
        name: str = "python",
        *,
        code_timeout_s: float = 10.0,
        memory_mb: int = 512,
        max_output_chars: int = 10_000,
        description: str = "Runs Python code in a sandbox and returns what it prints",
        **worker_kwargs: Any,
    ):
        super().__init__(name, self._run, extract=extract_code, description=description, **worker_kwargs)
        self.code_timeout_s = code_timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars

    def _run(self, code: str) -> str:
        return run_python(
            code, timeout_s=self.code_timeout_s, memory_mb=self.memory_mb, max_output_chars=self.max_output_chars
        )
