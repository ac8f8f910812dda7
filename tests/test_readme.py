"""Every name the README imports from the package, and every ``conductor.<name>`` it mentions, still exists: the
public API the README teaches is what the package offers (a restructuring that breaks a snippet fails here)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
IMPORTS = sorted(
    {
        (node.module, alias.name)
        for block in BLOCKS
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "conductor"
        for alias in node.names
    }
)


def test_the_readme_has_python_snippets_that_import_the_package() -> None:
    assert len(IMPORTS) >= 10, IMPORTS  # the parse found the snippets: this test can fail


@pytest.mark.parametrize(("module", "name"), IMPORTS, ids=[f"{m}.{n}" for m, n in IMPORTS])
def test_every_name_a_readme_snippet_imports_exists(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"


def test_every_conductor_attribute_the_readme_names_exists() -> None:
    import conductor

    named = set(re.findall(r"\bconductor\.([a-z_][A-Za-z_]*)\(", README.read_text()))
    assert named, "the README calls conductor.<function>(...) somewhere"
    assert not [name for name in named if not hasattr(conductor, name)]
