"""The package's layout: no two files import each other, directly or round a loop, and the rooms of
``conductor.modules`` import only the rooms below them.

The file-level import graph is read from the source with ``ast``: every import counts, at the top of a file, inside a
function, or under ``TYPE_CHECKING``. ``from conductor.x import y`` points at the module ``conductor/x/y.py`` (or the
package ``conductor/x/y/``) when ``y`` is one, else at ``conductor/x.py`` or ``conductor/x/__init__.py``; an import of
a package is an import of its ``__init__.py``. A package ``__init__.py``'s imports of its own children are left out:
re-exporting them is how packages work.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "conductor"

MODULE_ROOMS = ("_answer", "workflow", "workers", "tools", "pool", "run", "programs", "baselines")
"""The rooms of ``conductor.modules``, lowest first: each imports only the rooms before it."""


def _file_of(dotted: str, root: Path) -> Path | None:
    """The file that ``import dotted`` runs last: a package's ``__init__.py`` or a module; None outside the package."""
    if dotted != "conductor" and not dotted.startswith("conductor."):
        return None
    base = root.joinpath(*dotted.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _dotted(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, path: Path, root: Path) -> Iterator[Path]:
    """The package files one import statement of ``path`` points at."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        module = node.module or ""
        if node.level:  # relative: from the package ``path`` is in, ``level - 1`` packages up
            package = _dotted(path, root).split(".")
            package = package if path.name == "__init__.py" else package[:-1]
            module = ".".join([*package[: len(package) - node.level + 1], *([module] if module else [])])
        names = [
            f"{module}.{alias.name}" if _file_of(f"{module}.{alias.name}", root) else module for alias in node.names
        ]
    for name in names:
        target = _file_of(name, root)
        if target is not None:
            yield target


def import_graph(root: Path = ROOT) -> dict[Path, set[Path]]:
    """Every file of the package ``conductor`` in ``root`` and the package files it imports (itself left out)."""
    graph: dict[Path, set[Path]] = {}
    for path in sorted((root / "conductor").rglob("*.py")):
        edges = graph.setdefault(path, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, path, root):
                own_child = path.name == "__init__.py" and target.is_relative_to(path.parent)
                if target != path and not own_child:
                    edges.add(target)
    return graph


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """One loop through each group of files that reach each other (the strongly connected components, by Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    groups: list[list[Path]] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_loop(graph, set(group), group[0]) for group in groups]


def _loop(graph: dict[Path, set[Path]], group: set[Path], start: Path) -> list[Path]:
    """A shortest path from ``start`` back to itself inside ``group``."""
    came_from: dict[Path, Path] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node] & group):
                if other == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if other not in came_from:
                    came_from[other] = node
                    following.append(other)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected group but on no loop")


def _shown(loop: list[Path]) -> str:
    return " -> ".join(str(path.relative_to(ROOT)) for path in loop)


def test_no_two_files_import_each_other() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (every import counts, lazy and TYPE_CHECKING ones too):\n" + "\n".join(
        _shown(loop) for loop in found
    )


def _room(path: Path) -> str | None:
    """The room of ``conductor.modules`` that ``path`` is in (None for files outside a room)."""
    modules = PACKAGE / "modules"
    if not path.is_relative_to(modules):
        return None
    first = path.relative_to(modules).with_suffix("").parts[0]
    return first if first in MODULE_ROOMS else None


def test_module_rooms_import_only_rooms_below() -> None:
    rooms = {path.name for path in (PACKAGE / "modules").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert rooms | {"_answer"} == set(MODULE_ROOMS), "a room of conductor.modules is missing from MODULE_ROOMS"
    upward = [
        f"{path.relative_to(ROOT)} ({room}) imports {target.relative_to(ROOT)} ({_room(target)})"
        for path, targets in import_graph().items()
        if (room := _room(path)) is not None
        for target in sorted(targets)
        if _room(target) is not None and MODULE_ROOMS.index(_room(target)) > MODULE_ROOMS.index(room)
    ]
    assert not upward, "rooms that import a room above them:\n" + "\n".join(upward)


def test_the_graph_counts_lazy_and_type_checking_imports_but_not_re_exports(tmp_path: Path) -> None:
    files = {
        "__init__.py": "from conductor.room import Thing\n",
        "room/__init__.py": "from conductor.room._thing import Thing\n",
        "room/_thing.py": "def make():\n    from conductor import _util\n\n    return _util\n",
        "_util.py": "import typing\n\nif typing.TYPE_CHECKING:\n    from conductor.room._thing import Thing\n",
    }
    for name, text in files.items():
        (tmp_path / "conductor" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "conductor" / name).write_text(text)
    package = tmp_path / "conductor"
    graph = import_graph(tmp_path)
    assert graph[package / "__init__.py"] == set()  # its own children
    assert graph[package / "room" / "_thing.py"] == {package / "_util.py"}
    assert cycles(graph) == [[package / "_util.py", package / "room" / "_thing.py", package / "_util.py"]]
