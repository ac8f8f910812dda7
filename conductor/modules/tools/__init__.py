"""The built-in tool workers: an exact calculator, a Python runner in a bubblewrap sandbox, and the workers that
answer from the earlier steps they are shown (``vote``, and ``check``, which runs candidate code in the sandbox)."""

from conductor.modules.tools._aggregate import CheckWorker, VoteWorker
from conductor.modules.tools._calculator import CalculatorWorker, calculate, extract_expression
from conductor.modules.tools._sandbox import BWRAP_ENV, Isolation, PythonWorker, extract_code, run_python

__all__ = [
    "BWRAP_ENV",
    "CalculatorWorker",
    "CheckWorker",
    "Isolation",
    "PythonWorker",
    "VoteWorker",
    "calculate",
    "extract_code",
    "extract_expression",
    "run_python",
]
