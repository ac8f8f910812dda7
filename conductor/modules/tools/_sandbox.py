"""A sandboxed Python runner and the worker that runs the code in its prompt.

The code runs under bubblewrap (``bwrap``) as an unprivileged user (uid 65534) in its own user, PID, network, IPC,
UTS and mount namespaces. It sees a read-only system (``/usr`` and the Python installation), a private, size-limited
``/tmp`` as its working directory, its own ``/proc`` (no other process), a minimal ``/dev``, no network, and none of
the parent's environment variables. A seccomp filter refuses new processes (threads are allowed); rlimits cap CPU
time, memory, threads and file size; on the wall-clock limit bwrap is killed, which ends its PID namespace and
everything in it. An audit hook inside the interpreter stays as a second line that explains honest mistakes.

Without bwrap, or where it can't create namespaces, the tool refuses to run unless it was built with
``isolation="none"``: then only the audit hook, which code can switch off from inside, and the rlimits guard the
machine.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import platform
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Literal

from conductor.errors import CodeTimeout, ToolInputError, WorkerError
from conductor.modules._syntax import parse_python
from conductor.modules.workers import TRUNCATED, ToolWorker

logger = logging.getLogger(__name__)

Isolation = Literal["bwrap", "none"]
BWRAP_ENV = "CONDUCTOR_BWRAP"  # the bwrap binary to use; default: `bwrap` on PATH
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`)"

_MAX_FILE_BYTES = 64 * 2**20  # one file, and the sandbox's whole /tmp
# RLIMIT_NPROC: threads of the sandbox's user. bwrap maps that user to its caller, and the kernel doesn't apply the
# limit to root: run as root, the seccomp filter (no processes) and the memory limit (thread stacks) are what hold.
_MAX_THREADS = 64
_SANDBOX_UID = 65534  # nobody
_SANDBOX_TMP = "/tmp"
_STDERR_TAIL_LINES = 20
_STDERR_TAIL_CHARS = 2000

# Runs in the child with ``python -I -B -u -c``: limits itself, reads the program from stdin, installs the audit hook,
# then runs the program as ``__main__``. Tracebacks show the program's own lines, without the bootstrap's frame.
# The limits are set here, in the sandbox's first process, because RLIMIT_NPROC counts processes per user and user
# namespace: set on bwrap, before it creates the namespace, it would count every process of the launching user.
# The code can lower the limits but not raise them (that needs CAP_SYS_RESOURCE, which nothing in the sandbox has).
_LIMITS = r"""
import linecache, os, resource, socket, sys, traceback, types

limits = [(resource.RLIMIT_AS, int(sys.argv[1])), (resource.RLIMIT_CPU, int(sys.argv[2])),
          (resource.RLIMIT_FSIZE, int(sys.argv[3])), (resource.RLIMIT_CORE, 0)]
if int(sys.argv[4]):  # only in the sandbox: outside it, the count would be of all the user's processes
    limits.append((resource.RLIMIT_NPROC, int(sys.argv[4])))
for kind, value in limits:
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    # The CPU limit's hard value is a second later, so the soft one sends SIGXCPU (reported) before SIGKILL.
    resource.setrlimit(kind, (value, value + 1 if kind == resource.RLIMIT_CPU and value != hard else value))

source = sys.stdin.buffer.read().decode("utf-8", "replace")
sys.argv = ["<code>"]
linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
root = os.path.realpath(os.getcwd())
"""

# The second line of defence: refuses network sockets, DNS, new processes, signals, raising limits, ctypes calls and
# writes outside the working directory with a message that says so. ctypes may be imported (numpy and sympy do at
# import, opening only the process itself) but can't open libraries, look up or call C functions, or read raw memory.
_AUDIT_HOOK = r"""
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
"""

_RUN = r"""
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

# ---- the seccomp filter: no new processes ----------------------------------------------------------------------------
# A classic BPF program over ``struct seccomp_data`` (nr at offset 0, arch at 4, the low half of arg 0 at 16 on these
# little-endian machines). ``clone`` is allowed only for threads; ``clone3`` keeps its flags in memory a filter can't
# read, so it answers ENOSYS and the C library falls back to ``clone``.
_SYSCALLS = {  # machine: (AUDIT_ARCH_*, clone, clone3, the syscalls that only make processes)
    "x86_64": (0xC000003E, 56, 435, (57, 58)),  # fork, vfork
    "aarch64": (0xC00000B7, 220, 435, ()),
}
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000


def _seccomp_filter() -> bytes | None:
    """The filter for this machine, or None on one it doesn't know (then only RLIMIT_NPROC limits processes)."""
    known = _SYSCALLS.get(platform.machine())
    if known is None:
        return None
    arch, clone, clone3, forks = known
    allow, deny, nosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (load, 0, 0, 0)]
    program += [(jge, 0, 1, _X32_SYSCALL_BIT), (ret, 0, 0, deny)]
    for number in forks:
        program += [(jeq, 0, 1, number), (ret, 0, 0, deny)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, nosys), (jeq, 0, 4, clone), (load, 0, 0, 16)]
    program += [(jset, 0, 1, _CLONE_THREAD), (ret, 0, 0, allow), (ret, 0, 0, deny), (ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# ---- bubblewrap ------------------------------------------------------------------------------------------------------
def _bwrap_path() -> str:
    """The bwrap binary (``$CONDUCTOR_BWRAP`` or ``bwrap`` on PATH); a clear error if there is none."""
    name = os.environ.get(BWRAP_ENV) or "bwrap"
    path = shutil.which(name)
    if path is None:
        raise WorkerError(
            f"the Python tool runs code only inside a bubblewrap sandbox, and {name!r} was not found: {INSTALL_HINT}, "
            'or build the tool with isolation="none" (`isolation: none` in a pool config) to run code unisolated',
            retryable=False,
        )
    return path


def _system_binds() -> list[str]:
    """Read-only binds of the system, with the same paths as outside (symlinks hold)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged /usr: a link into it
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ("/etc/ld.so.cache", "/etc/localtime"):
        args += ["--ro-bind-try", name, name]
    return args


def _python_binds() -> list[str]:
    """Read-only binds of the Python installation, with the same paths as outside. Made after the sandbox's own
    ``/tmp``: an interpreter under ``/tmp`` (a venv in a temporary folder, a pytest ``tmp_path``) would else be
    hidden by it."""
    args = []
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    python.add(os.path.dirname(os.path.realpath(sys.executable)))
    python = {os.path.realpath(p) for p in python}
    for path in sorted(python):
        covered = any(path.startswith(other + os.sep) for other in python | {"/usr"})
        if not covered:
            args += ["--ro-bind", path, path]
    return args


def _bwrap_command(bwrap: str, seccomp_fd: int | None) -> list[str]:
    """bwrap's arguments up to the command it runs: namespaces, user, mounts, environment, seccomp filter."""
    command = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    command += ["--uid", str(_SANDBOX_UID), "--gid", str(_SANDBOX_UID), "--hostname", "sandbox"]
    command += _system_binds()
    command += ["--proc", "/proc", "--dev", "/dev", "--size", str(_MAX_FILE_BYTES), "--tmpfs", _SANDBOX_TMP]
    command += _python_binds()
    # Only the size-limited /tmp stays writable: bwrap's root and /dev are tmpfs without a size limit.
    command += ["--remount-ro", "/dev", "--remount-ro", "/"]
    command += ["--chdir", _SANDBOX_TMP, "--clearenv"]
    for name, value in {**_sandbox_env(_SANDBOX_TMP), "PATH": "/usr/local/bin:/usr/bin:/bin"}.items():
        command += ["--setenv", name, value]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    return [*command, "--"]


@functools.cache
def _check_bwrap(bwrap: str) -> None:
    """Run an empty sandbox once per binary, so a machine that can't make namespaces gets a clear error."""
    with _seccomp_fd() as fd:
        command = [*_bwrap_command(bwrap, fd), sys.executable, "-I", "-S", "-c", "pass"]
        result = subprocess.run(command, capture_output=True, text=True, pass_fds=_fds(fd), timeout=30, env={})
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"])[0]
        raise WorkerError(
            f"bubblewrap ({bwrap}) can't create the Python tool's sandbox here: {why}. {_fix(why)}",
            retryable=False,
        )


def _fix(why: str) -> str:
    """What to do about bwrap's complaint ``why``: the interpreter not found inside, or no user namespaces."""
    if "execvp" in why:
        return (
            f"The interpreter {sys.executable} is not visible inside the sandbox (bound read-only from "
            f"{sys.prefix}); run the tool from a Python installed in an ordinary folder, or build it with "
            'isolation="none" to run code unisolated'
        )
    return (
        "It needs user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ "
        "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap; in Docker, a seccomp "
        'profile that allows them); or build the tool with isolation="none" to run code unisolated'
    )


@contextlib.contextmanager
def _seccomp_fd():
    """A pipe's read end holding the seccomp filter for bwrap to read, or None where there is no filter."""
    program = _seccomp_filter()
    if program is None:
        yield None
        return
    read, write = os.pipe()
    try:
        os.write(write, program)  # a few hundred bytes: fits the pipe's buffer
    finally:
        os.close(write)
    try:
        yield read
    finally:
        os.close(read)


def _fds(fd: int | None) -> tuple[int, ...]:
    return () if fd is None else (fd,)


def _sandbox_env(home: str) -> dict[str, str]:
    """Nothing from the parent's environment but ``PATH``; home and temp files inside the sandbox; one BLAS thread,
    so numeric libraries don't reserve per-core buffers against the memory limit."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, "TMPDIR": home}
    env.update(dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"))
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group. Called before the child is reaped, so its id can't be reused yet.

    Under bwrap the group is bwrap itself; its death kills the sandbox's PID 1 (``--die-with-parent``), and with it
    every process of the namespace, whatever session or group they moved to."""
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


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_chars: int = 10_000,
    isolation: Isolation = "bwrap",
) -> str:
    """Run ``code`` in a sandboxed Python process and return what it prints.

    The result is the program's stdout (cut at ``max_output_chars``, marked "[output truncated]"); when it fails,
    the end of its traceback or how it was killed follows, so an error in the code is an answer, not a
    ``WorkerError``. Running past ``timeout_s`` raises ``CodeTimeout`` after everything the code started is killed.

    With ``isolation="bwrap"`` (the default) the code runs in a bubblewrap sandbox (see the module docstring); a
    machine without bwrap, or where it can't make namespaces, gets a ``WorkerError`` saying how to get it.
    ``isolation="none"`` runs it as a plain child process, in a fresh temporary directory with a clean environment,
    guarded only by rlimits and an audit hook that code can switch off: for trusted code on machines without bwrap.
    The limits in both cases: address space (``memory_mb``), CPU time, file size (64 MB) and no core dumps; under
    bwrap also the threads of the sandbox's user and the size of its ``/tmp``.
    """
    if isolation not in ("bwrap", "none"):
        raise ValueError(f"isolation must be 'bwrap' or 'none', not {isolation!r}")
    cpu_s = math.ceil(timeout_s) + 1
    bwrap = None
    if isolation == "bwrap":
        bwrap = _bwrap_path()
        _check_bwrap(bwrap)
    python = _python_command(memory_mb, cpu_s, isolated=bwrap is not None)
    with contextlib.ExitStack() as cleanup:
        command, workdir, env, fds = _launch(cleanup, python, bwrap)
        out, err, stopped, returncode = _run_child(command, workdir, env, fds, code, timeout_s, max_output_chars * 4)
    if stopped == "timeout":
        raise CodeTimeout(f"the code ran past its time limit of {timeout_s:g} s and was stopped")
    if bwrap is not None and returncode > 128:  # bwrap reports a child killed by signal N as 128 + N
        returncode = 128 - returncode
    return _answer(out, err, stopped, returncode, max_output_chars, cpu_s, memory_mb)


def _python_command(memory_mb: int, cpu_s: int, *, isolated: bool) -> list[str]:
    """The interpreter running the bootstrap (limits, audit hook, then the program read from stdin) with its limits."""
    bootstrap = _LIMITS + _AUDIT_HOOK + _RUN
    python = [sys.executable, "-I", "-B", "-u", "-c", bootstrap, str(memory_mb * 2**20), str(cpu_s)]
    python += [str(_MAX_FILE_BYTES), str(_MAX_THREADS if isolated else 0)]
    return python


def _launch(
    cleanup: contextlib.ExitStack, python: list[str], bwrap: str | None
) -> tuple[list[str], str | None, dict[str, str], tuple[int, ...]]:
    """How to start ``python``: the command, its working directory, environment and inherited file descriptors.
    Under ``bwrap`` (its path), inside the sandbox with the seccomp filter; without, in a fresh temporary directory.
    What they need open stays open until ``cleanup`` closes."""
    if bwrap is not None:
        seccomp_fd = cleanup.enter_context(_seccomp_fd())
        return _bwrap_command(bwrap, seccomp_fd) + python, None, {}, _fds(seccomp_fd)
    workdir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="conductor-python-", ignore_cleanup_errors=True))
    return python, workdir, _sandbox_env(workdir), ()


def _run_child(
    command: list[str],
    workdir: str | None,
    env: dict[str, str],
    fds: tuple[int, ...],
    code: str,
    timeout_s: float,
    stdout_cap: int,
) -> tuple[bytes, bytes, str | None, int]:
    """Start ``command``, hand it ``code`` on stdin and collect its output (see ``_collect``) until ``timeout_s``
    passes; then kill whatever is left of it. Returns stdout, the tail of stderr, why it stopped early, exit status."""
    deadline = time.monotonic() + timeout_s
    # No preexec_fn (unsafe with threads, and workers are called from several): the bootstrap sets the limits.
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=workdir,
        env=env,
        start_new_session=True,
        pass_fds=fds,
    )
    try:
        try:
            proc.stdin.write(code.encode("utf-8", "replace"))  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # the child died at start; its stderr says why
        out, err, stopped = _collect(proc, deadline, stdout_cap)
    finally:
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(BrokenPipeError):  # stdin may still hold code the child never read
                stream.close()  # type: ignore[union-attr]
    return out, err, stopped, proc.returncode


def _answer(
    out: bytes, err: bytes, stopped: str | None, returncode: int, max_output_chars: int, cpu_s: int, memory_mb: int
) -> str:
    """What the tool answers: the program's output, cut and marked when too long, then how it failed, if it did."""
    text = out.decode("utf-8", "replace")
    truncated = stopped == "output" or len(text) > max_output_chars
    parts = [f"{text[:max_output_chars]}\n{TRUNCATED}" if truncated else text.rstrip("\n")]
    if returncode != 0 and not truncated:
        parts.append(_exit_note(returncode, err.decode("utf-8", "replace"), cpu_s, memory_mb))
    return "\n".join(p for p in parts if p) or "[no output]"


_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


def extract_code(text: str) -> str:
    """The last fenced code block of ``text`` tagged Python or untagged; else ``text`` itself if it parses as Python."""
    blocks = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    try:
        parse_python(text)
    except (SyntaxError, ValueError):
        raise ToolInputError("no Python code found: put it in a ```python fenced block") from None
    return text


class PythonWorker(ToolWorker):
    """Runs the Python code in its prompt (see ``extract_code``) with ``run_python`` and answers with what it prints.

    ``code_timeout_s`` limits one run; keep it below the worker's ``timeout_s`` (the executor's limit for the call),
    so the sandbox stops its own process and reports the timeout. ``isolation="none"`` runs code without the
    bubblewrap sandbox (see ``run_python``): only for trusted code, and it says so in the log.
    """

    def __init__(
        self,
        name: str = "python",
        *,
        code_timeout_s: float = 10.0,
        memory_mb: int = 512,
        max_output_chars: int = 10_000,
        isolation: Isolation = "bwrap",
        description: str = "Runs Python code in a sandbox and returns what it prints",
        **worker_kwargs: Any,
    ):
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none', not {isolation!r}")
        super().__init__(name, self._run, extract=extract_code, description=description, **worker_kwargs)
        self.code_timeout_s = code_timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.isolation = isolation
        if isolation == "none":
            logger.warning(
                "UNISOLATED: the Python tool %r runs code without an OS sandbox (isolation='none'); code it runs "
                "can read this process's secrets and files, start processes and reach the network. Use it only "
                "for trusted code.",
                name,
            )

    def _run(self, code: str) -> str:
        return run_python(
            code,
            timeout_s=self.code_timeout_s,
            memory_mb=self.memory_mb,
            max_output_chars=self.max_output_chars,
            isolation=self.isolation,
        )
