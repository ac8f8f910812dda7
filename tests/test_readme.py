"""Every name the README and the documentation pages import from the package, and every ``conductor.<name>`` they
call, still exists: the public API they teach is what the package offers (a restructuring that breaks a snippet fails
here). The README's local example runs as written."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = "\n".join(page.read_text() for page in PAGES)
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
IMPORTS = sorted(
    {
        (node.module, alias.name)
        for block in BLOCKS
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "conductor"
        for alias in node.names
    }
)


def test_the_pages_have_python_snippets_that_import_the_package() -> None:
    assert len(IMPORTS) >= 10, IMPORTS  # the parse found the snippets: this test can fail


@pytest.mark.parametrize(("module", "name"), IMPORTS, ids=[f"{m}.{n}" for m, n in IMPORTS])
def test_every_name_a_snippet_imports_exists(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"


def test_every_conductor_attribute_the_pages_call_exists() -> None:
    import conductor

    named = set(re.findall(r"\bconductor\.([a-z_][A-Za-z_]*)\(", TEXT))
    assert named, "the pages call conductor.<function>(...) somewhere"
    assert not [name for name in named if not hasattr(conductor, name)]


@pytest.mark.slow
def test_the_readmes_local_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped conductor over the embedded pool: greedy under its grammar, it sends the arithmetic to the
    calculator, so the answer is exact."""
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if "load(" in block]
    exec(compile(example, str(README), "exec"), {})
    assert capsys.readouterr().out.splitlines()[0] == "395"
