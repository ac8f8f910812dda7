"""Every distribution the package's code imports is declared in pyproject.toml, so that an install from PyPI has what
the code needs (a dependency of a dependency may vanish in its next release). Found by scanning the imports of
``conductor/`` and asking ``importlib.metadata`` which distribution provides each module."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The files that `import conductor` and the command line load: their module-level imports every install needs.
LOADED_BY_IMPORT = """
import sys, conductor, conductor.cli
for module in list(sys.modules.values()):
    if module.__name__.partition(".")[0] == "conductor":
        print(module.__file__)
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extra: str | None = None) -> set[str]:
    """The distributions that ``dependencies`` (``extra=None``) or an extra names, the extras it names included."""
    requirements = map(Requirement, PROJECT["optional-dependencies"][extra] if extra else PROJECT["dependencies"])
    names = set()
    for requirement in requirements:
        if canonical(requirement.name) == canonical(PROJECT["name"]):
            names |= {name for inner in requirement.extras for name in declared(inner)}
        else:
            names.add(canonical(requirement.name))
    return names


def imported_modules(path: Path, module_level_only: bool = False) -> Iterator[tuple[str, int]]:
    """``(top-level module, line)`` for each third-party import in ``path``; with ``module_level_only``, only those that
    run when the file is imported (not in functions, nor under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    nodes = _module_level(tree.body) if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top not in sys.stdlib_module_names and top != "conductor":
                yield top, node.lineno


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody)


def undeclared(files: list[Path], allowed: set[str], module_level_only: bool = False) -> list[str]:
    """``file:line imports module (distribution)`` for each import in ``files`` whose distribution isn't ``allowed``.
    A module that no installed distribution provides is taken to be its own distribution's name."""
    providers = importlib.metadata.packages_distributions()
    found = []
    for path in files:
        for module, line in imported_modules(path, module_level_only):
            distributions = {canonical(name) for name in providers.get(module, [module])}
            if not distributions & allowed:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}:{line} imports {module} ({' or '.join(sorted(distributions))})")
    return found


def test_every_imported_distribution_is_declared() -> None:
    # Not dev's own packages (pytest, httpx, ...): the tests use them, the package's code must not need them.
    extras = [declared(extra) for extra in PROJECT["optional-dependencies"] if extra != "dev"]
    missing = undeclared(sorted((ROOT / "conductor").rglob("*.py")), declared().union(*extras))
    assert not missing, "declare in pyproject.toml (dependencies, or the extra that needs it):\n" + "\n".join(missing)


def test_importing_the_package_needs_only_the_core_dependencies() -> None:
    result = subprocess.run([sys.executable, "-c", LOADED_BY_IMPORT], capture_output=True, text=True, check=True)
    loaded = sorted(Path(line) for line in result.stdout.splitlines())
    assert len(loaded) > 20 and all(path.is_relative_to(ROOT / "conductor") for path in loaded), loaded
    missing = undeclared(loaded, declared(), module_level_only=True)
    assert not missing, "`import conductor` needs: declare in dependencies, or import lazily:\n" + "\n".join(missing)


def test_the_scan_finds_undeclared_imports_and_tells_module_level_from_lazy(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nimport json\nimport numpy\n\nif TYPE_CHECKING:\n    import torch\n\n\n"
        "def later():\n    import yaml\n"
    )
    assert undeclared([module], {"numpy"}) == [
        f"{module}:6 imports torch (torch)",
        f"{module}:10 imports yaml (pyyaml)",
    ]
    assert undeclared([module], set(), module_level_only=True) == [f"{module}:3 imports numpy (numpy)"]
