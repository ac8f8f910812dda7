"""Tool workers: the calculator, the Python sandbox and callables as workers."""

from __future__ import annotations

import decimal
import logging
import math
import os
import socket
import time

import pytest

from conductor.errors import ConfigError, WorkerError, WorkerTimeout
from conductor.modules.pool import WorkerPool
from conductor.modules.tools import (
    BWRAP_ENV,
    CalculatorWorker,
    PythonWorker,
    calculate,
    extract_code,
    extract_expression,
    run_python,
)
from conductor.modules.workers import TRUNCATED, Completion, ToolWorker
from tests.modules.worker_contract import WorkerContract

WORKER_PROMPT = (
    "You are solving one subtask within an overall task.\n\n"
    "Overall task:\nA farm has 17 rows of 23 trees and 4 more trees by the gate. How many trees are there?\n\n"
    "Your subtask:\n{subtask}"
)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Answer the subtask."}, {"role": "user", "content": text}]


# ---- calculator ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("2 - 3 - 4", "-5"),
        ("-2**2", "-4"),
        ("2**3**2", "512"),
        ("2^10", "1024"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("10/4", "2.5"),
        ("6/3", "2"),
        ("1/3", repr(1 / 3)),
        ("2**-1", "0.5"),
        ("1e20 / 1", "1e+20"),
        ("sqrt(16)", "4"),
        ("sqrt(2)", repr(math.sqrt(2))),
        ("sqrt(10**40)", "1" + "0" * 20),
        ("log10(1000)", "3"),
        ("log(8, 2)", "3"),
        ("log(e)", "1"),
        ("exp(0) + cos(0) + sin(0) + tan(0)", "2"),
        ("2*pi", repr(2 * math.pi)),
        ("abs(-4) + floor(-2.5) + ceil(2.1)", "4"),
        ("round(2.567, 2)", "2.57"),
        ("round(2.5) + round(3.5)", "6"),
        ("max(3, 7, 5) - min(3, 7)", "4"),
        ("factorial(25)", str(math.factorial(25))),
        ("3 x 4", "12"),
        ("3×4", "12"),
        ("1,500 + 1", "1501"),
        ("1,000,000 * 3", "3000000"),
        ("max(1,500)", "500"),  # an argument list, not one thousand five hundred
    ],
)
def test_calculate(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


def test_integers_stay_exact() -> None:
    assert calculate("3**200 + 1") == str(3**200 + 1)
    assert calculate("factorial(30) // factorial(28)") == "870"
    # Over the 4,300 digits that str(int) refuses by default, and still exact.
    assert int(decimal.Decimal(calculate("2**20000"))) == 2**20000


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "(1).real",
        "math.pi",
        "foo + 1",
        "open('x')",
        "[1, 2]",
        "'a' * 3",
        "True + 1",
        "lambda: 1",
        "sqrt(x=4)",
        "sqrt(1, 2)",
        "2 +* 3",
        "(1 + 2",
        "",
        "1+" * 600 + "1",
    ],
)
def test_calculate_refuses(expression: str) -> None:
    with pytest.raises(WorkerError):
        calculate(expression)


@pytest.mark.parametrize("expression", ["9**9**9", "10**10**5", "2**(2**40)", "factorial(10**6)", "(10**5000)**3"])
def test_huge_results_are_refused_fast(expression: str) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"too large|factorial"):
        calculate(expression)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("expression", ["1/0", "5 % 0", "1 // (2 - 2)", "0 ** -1"])
def test_division_by_zero(expression: str) -> None:
    with pytest.raises(WorkerError, match="division by zero"):
        calculate(expression)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (WORKER_PROMPT.format(subtask="compute 17*23+4"), "17*23+4"),
        ("What is (17*23+4)?", "(17*23+4)"),
        ("Compute 2 + 2 for the 3 teams.", "2 + 2"),
        ("Earlier: 5*6 was 30.\nNow add 2^3 to it", "2^3"),
        ("12.5 * 4", "12.5 * 4"),
        ("How much is 7?", "7"),
        ("What is 772 minus 949?", "772 - 949"),
        ("Q: What is 6492 Divided By 541?\nA:", "6492 / 541"),
        ("What is 66560 times 93873? Also 3 plus (2 multiplied by 4)", "3 + (2 * 4)"),
        ("Add the times 3 and 4 won", "4"),
    ],
)
def test_extract_expression(text: str, expected: str) -> None:
    assert extract_expression(text) == expected


def test_extract_expression_needs_one() -> None:
    with pytest.raises(WorkerError, match="no arithmetic expression"):
        extract_expression("Summarise the earlier steps.")


def test_calculator_worker_answers_a_worker_prompt() -> None:
    worker = CalculatorWorker()
    completion = worker.complete(user(WORKER_PROMPT.format(subtask="compute 17*23+4")), max_tokens=64, temperature=0)
    assert completion.text == "395"
    assert completion.output_tokens == 1
    assert worker.name == "calculator"
    assert worker.description == "Evaluates arithmetic expressions exactly"


def test_calculator_worker_errors_name_the_worker() -> None:
    with pytest.raises(WorkerError, match=r"^calc: division by zero"):
        CalculatorWorker("calc").complete(user("compute 1/0"), max_tokens=64, temperature=0)


# ---- Python sandbox --------------------------------------------------------------------------------------------------
def test_run_python_returns_what_it_prints() -> None:
    assert run_python("x = 17 * 23 + 4\nprint(x)", timeout_s=5) == "395"
    assert run_python("x = 1", timeout_s=5) == "[no output]"


def test_an_exception_is_an_answer_with_its_traceback() -> None:
    result = run_python("print('before')\nvalues = [1, 2]\nvalues[5]", timeout_s=5)
    assert result.startswith("before\n")
    assert "Traceback" in result
    assert 'File "<code>", line 3' in result
    assert "values[5]" in result  # the source line is shown
    assert result.rstrip().endswith("IndexError: list index out of range")


def test_a_syntax_error_is_an_answer() -> None:
    assert "SyntaxError" in run_python("print(1", timeout_s=5)


def test_an_infinite_loop_times_out_and_leaves_no_process() -> None:
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"time limit of 1\.5 s"):
        run_python("while True: pass", timeout_s=1.5)
    assert time.monotonic() - started < 1.5 + 2
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_the_python_worker_raises_worker_timeout() -> None:
    worker = PythonWorker(code_timeout_s=1)
    with pytest.raises(WorkerTimeout, match=r"^python: "):
        worker.complete(user("```python\nimport time\ntime.sleep(30)\n```"), max_tokens=64, temperature=0)


@pytest.mark.parametrize(
    "code",
    ["x = []\nwhile True: x.append(' ' * 10**6)", "x = []\nwhile True: x.append(str(len(x)))"],  # big, small blocks
)
def test_unbounded_allocation_is_stopped_by_the_memory_limit(code: str) -> None:
    result = run_python(code, timeout_s=10, memory_mb=256)
    assert "MemoryError" in result
    assert "memory limit: 256 MB" in result
    assert run_python("print('still here')", timeout_s=5) == "still here"


@pytest.mark.parametrize("code", ["for i in range(100_000): print(i)", "while True: print('spam')"])
def test_output_over_the_cap_is_truncated(code: str) -> None:
    started = time.monotonic()
    result = run_python(code, timeout_s=5, max_output_chars=100)
    assert result.endswith(TRUNCATED)
    assert len(result) == 100 + 1 + len(TRUNCATED)
    assert time.monotonic() - started < 3  # a program that prints forever is stopped at the cap, not the timeout


def test_network_connections_are_blocked() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')"
        result = run_python(code, timeout_s=5)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    assert "connected" not in result.splitlines()
    assert "PermissionError: sandbox" in result


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['ls'])",
        "import subprocess\nsubprocess.run(['echo', 'ESC' + 'APED'])",
        "import os\nos.system('echo ESC''APED')",
        "import os\nos.execv('/bin/echo', ['echo', 'ESC' + 'APED'])",
        "import os\nos.fork()",
        "import os\nos.kill(os.getppid(), 9)",
        "import ctypes\nctypes.CDLL(None).system(b'echo ESC' + b'APED')",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
        "import socket\nsocket.getaddrinfo('example.com', 80)",
    ],
)
def test_processes_signals_and_escapes_are_blocked(code: str) -> None:
    result = run_python(code + "\nprint('DONE')", timeout_s=5)
    assert "not allowed" in result
    assert "ESCAPED" not in result
    assert "DONE" not in result


def test_files_outside_the_working_directory_are_not_written(tmp_path) -> None:
    target = tmp_path / "outside.txt"
    result = run_python(f"open({str(target)!r}, 'w').write('x')", timeout_s=5)
    assert "Error" in result
    assert not target.exists()
    marker = f"conductor-test-{os.getpid()}-{time.monotonic_ns()}"
    inside = run_python(
        f"open({marker!r}, 'w').write('ok')\nprint(open({marker!r}).read())\nimport os\nprint(os.getcwd())",
        timeout_s=5,
    ).splitlines()
    assert inside[0] == "ok"
    assert not os.path.exists(os.path.join(inside[1], marker))  # the working directory is the sandbox's own tmpfs


def test_a_missing_bwrap_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent/bwrap")
    with pytest.raises(
        WorkerError, match=r"bubblewrap sandbox.*apt-get install bubblewrap.*isolation=\"none\""
    ) as info:
        run_python("print(1)", timeout_s=5)
    assert not info.value.retryable
    with pytest.raises(WorkerError, match=r"^python: the Python tool runs code only inside a bubblewrap sandbox"):
        PythonWorker().complete(user("```python\nprint(1)\n```"), max_tokens=16, temperature=0)


def test_a_bwrap_that_cannot_make_namespaces_is_a_clear_error(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(BWRAP_ENV, str(fake))
    with pytest.raises(WorkerError, match=r"can't create the Python tool's sandbox here: bwrap: No permissions"):
        run_python("print(1)", timeout_s=5)


def test_unisolated_execution_is_an_explicit_choice_and_warned(monkeypatch, caplog) -> None:
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent/bwrap")
    with caplog.at_level(logging.WARNING, logger="conductor.modules.tools._sandbox"):
        worker = PythonWorker(isolation="none")
    assert "UNISOLATED" in caplog.text
    assert worker.complete(user("```python\nprint(6 * 7)\n```"), max_tokens=16, temperature=0).text == "42"
    assert "not allowed" in run_python("import os\nos.system('true')", timeout_s=5, isolation="none")
    with pytest.raises(ValueError, match="isolation must be"):
        PythonWorker(isolation="docker")  # type: ignore[arg-type]


def test_a_pool_config_passes_the_isolation_option() -> None:
    pool = WorkerPool.from_config({"workers": [{"name": "py", "kind": "tool", "tool": "python", "isolation": "none"}]})
    assert pool[0].isolation == "none"
    assert (
        WorkerPool.from_config({"workers": [{"name": "py", "kind": "tool", "tool": "python"}]})[0].isolation == "bwrap"
    )
    with pytest.raises(ConfigError, match="is an option of the tools that run code"):
        WorkerPool.from_config({"workers": [{"name": "c", "kind": "tool", "tool": "calculator", "isolation": "none"}]})


def test_the_environment_is_not_inherited(monkeypatch) -> None:
    monkeypatch.setenv("CONDUCTOR_TEST_SECRET", "hunter2")
    result = run_python("import os\nprint(sorted(os.environ))", timeout_s=5)
    assert "PATH" in result
    assert "CONDUCTOR_TEST_SECRET" not in result


def test_numeric_libraries_still_import() -> None:
    pytest.importorskip("numpy")
    assert run_python("import numpy as np\nprint(int(np.arange(10).sum()))", timeout_s=10) == "45"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Try:\n```python\nprint(1)\n```\nor better:\n```python\nprint(2)\n```\nthanks", "print(2)\n"),
        ("```\nprint(3)\n```", "print(3)\n"),
        ("```py\nprint(4)\n```\n```bash\nls\n```", "print(4)\n"),
        ("print(5)", "print(5)"),
    ],
)
def test_extract_code(text: str, expected: str) -> None:
    assert extract_code(text) == expected


def test_extract_code_needs_code() -> None:
    with pytest.raises(WorkerError, match="no Python code found"):
        extract_code("Please compute the answer.")


def test_python_worker_answers_a_worker_prompt() -> None:
    worker = PythonWorker(max_tokens=64)
    prompt = WORKER_PROMPT.format(subtask="Run this:\n```python\nprint(17 * 23 + 4)\n```")
    completion = worker.complete(user(prompt), max_tokens=64, temperature=0)
    assert completion.text == "395"
    assert worker.name == "python"
    assert worker.description == "Runs Python code in a sandbox and returns what it prints"


# ---- callables as workers --------------------------------------------------------------------------------------------
def test_tool_worker_over_a_lambda() -> None:
    worker = ToolWorker("shout", lambda text: text.upper(), extract=lambda text: text.split(":")[-1].strip())
    messages = [
        {"role": "user", "content": "first: not me"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "say: hello"},
    ]
    completion = worker.complete(messages, max_tokens=100, temperature=0)
    assert completion == Completion("HELLO", worker.count_tokens(messages), 2)
    assert ToolWorker("len", len).complete(user("abcd"), max_tokens=10, temperature=0).text == "4"


def test_tool_worker_cuts_the_answer_to_max_tokens() -> None:
    worker = ToolWorker("long", lambda text: "x" * 1000)
    completion = worker.complete(user("go"), max_tokens=20, temperature=0)
    assert completion.output_tokens <= 20
    assert len(completion.text) <= 60
    assert completion.text.endswith(TRUNCATED)
    assert worker.complete(user("go"), max_tokens=0, temperature=0).text == ""


def test_a_raising_tool_gives_a_worker_error_naming_it() -> None:
    def broken(text: str) -> str:
        raise KeyError(text)

    with pytest.raises(WorkerError, match=r"^broken: KeyError") as info:
        ToolWorker("broken", broken).complete(user("boom"), max_tokens=10, temperature=0)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_tool_timeout_stays_a_timeout() -> None:
    def slow(text: str) -> str:
        raise WorkerTimeout("too slow")

    with pytest.raises(WorkerTimeout, match=r"^slow: too slow"):
        ToolWorker("slow", slow).complete(user("x"), max_tokens=10, temperature=0)


def test_a_tool_needs_a_user_message() -> None:
    with pytest.raises(WorkerError, match="no user message"):
        ToolWorker("echo", str).complete([{"role": "system", "content": "hi"}], max_tokens=10, temperature=0)


# ---- the worker contract ---------------------------------------------------------------------------------------------
class TestCalculatorContract(WorkerContract):
    @pytest.fixture
    def worker(self) -> CalculatorWorker:
        return CalculatorWorker()

    @pytest.fixture
    def prompt_messages(self) -> list[dict[str, str]]:
        return user(WORKER_PROMPT.format(subtask="compute 2**200 + 1"))  # 61 digits: cut at max_tokens=5


class TestPythonContract(WorkerContract):
    @pytest.fixture
    def worker(self) -> PythonWorker:
        return PythonWorker(code_timeout_s=10)

    @pytest.fixture
    def prompt_messages(self) -> list[dict[str, str]]:
        return user(WORKER_PROMPT.format(subtask="```python\nprint('tree ' * 20)\n```"))


class TestToolContract(WorkerContract):
    @pytest.fixture
    def worker(self) -> ToolWorker:
        return ToolWorker("reverse", lambda text: text[::-1])

    @pytest.fixture
    def prompt_messages(self) -> list[dict[str, str]]:
        return user("a prompt long enough to be cut at five tokens")
