"""Where the library keeps its files, and how it writes folders so that a killed process never leaves half of one."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from conductor.errors import ConductorError

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
