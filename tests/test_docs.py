"""The documentation site builds offline with ``mkdocs build --strict`` (broken links and anchors, griffe's docstring
warnings and a failing hook all fail it), and its generated reference pages hold what they are generated from: a
generator that silently wrote nothing fails here."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("run", "pool", "serve", "bench", "keys", "keys add", "train", "eval", "search", "compile")
ENVIRONMENT_READ = re.compile(r"""["']([A-Z][A-Z0-9]*_[A-Z0-9_]+)["']""")
"""A name like ``CONDUCTOR_CACHE`` as a string literal: in a file that touches ``os.environ``, an environment
variable it reads or sets (directly, or through a constant such as ``BWRAP_ENV``)."""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return folder


def page_text(site: Path, page: str) -> str:
    """A built page's text, tags dropped and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", (site / page / "index.html").read_text()))


def test_the_cli_reference_holds_every_subcommands_help(site: Path) -> None:
    text = page_text(site, "reference/cli")
    for command in SUBCOMMANDS:
        assert f"usage: conductor {command} " in text, command
    assert "--max-worker-calls" in text  # a flag of `search`: the parsers' options are there, not only their names


def test_the_config_reference_holds_the_run_configs_fields(site: Path) -> None:
    from conductor.cli import RunConfig
    from conductor.optimizers import ProgramSearchConfig

    text = page_text(site, "reference/config")
    for model in (RunConfig, ProgramSearchConfig):  # the top level, and a section it holds
        for field in model.model_fields:
            assert field in text, f"{model.__name__}.{field}"
    assert ProgramSearchConfig.model_fields["max_worker_calls"].description in text


def docs_hooks() -> ModuleType:
    """``docs/hooks.py``, the generator of the reference pages, imported by path (``docs/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_field_on_the_config_page_has_a_description() -> None:
    hooks = docs_hooks()
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    targets = [marker[2] for marker in hooks.MARKER.finditer(page) if marker[1] == "config-schema"]
    assert "conductor.cli:RunConfig" in targets  # the markers are found: this test can fail
    undescribed = []
    for target in targets:
        model = ""
        for line in hooks.config_schema(target).splitlines():
            if line.startswith("#"):
                model = line.lstrip("# ")
            elif line.startswith("| `"):  # a field's row: key, type, default, description
                cells = re.split(r"(?<!\\)\|", line)  # a pipe escaped inside a cell doesn't end it
                if not cells[-2].strip():
                    undescribed.append(f"{target} {model}.{cells[1].strip()}")
    assert not undescribed, "give these fields a pydantic.Field(description=...): " + ", ".join(undescribed)


def test_the_api_reference_documents_the_public_names(site: Path) -> None:
    text = page_text(site, "reference/api/conductor")
    for name in ("Conductor", "WorkerPool", "Budget", "load_program"):
        assert name in text


def test_the_environment_page_lists_every_variable_the_package_touches() -> None:
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    touched = {
        name
        for source in (ROOT / "conductor").rglob("*.py")
        if "os.environ" in (code := source.read_text()) or "getenv" in code
        for name in ENVIRONMENT_READ.findall(code)
    }
    assert "CONDUCTOR_CACHE" in touched  # the search finds them: this test can fail
    assert not sorted(name for name in touched if f"`{name}`" not in page)
