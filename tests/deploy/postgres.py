"""A throwaway PostgreSQL cluster for the tests: ``initdb`` and ``pg_ctl`` from PATH, else from Debian's
``/usr/lib/postgresql/<version>/bin`` (``apt-get install postgresql``), run as the ``postgres`` user when the tests run
as root (PostgreSQL refuses root), listening only on a Unix socket in a temporary folder, with fsync off (nothing in it
outlives the tests). Without the binaries the tests that use it skip, saying why."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

BINARIES = ("initdb", "pg_ctl", "postgres")
_databases = itertools.count()


def binaries() -> dict[str, str | None]:
    """Each PostgreSQL server program's path (``None``: not found), from PATH or else Debian's newest version."""
    debian = ":".join(sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]), reverse=True))
    return {name: shutil.which(name) or shutil.which(name, path=debian) for name in BINARIES}


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    """Start a cluster; yield the URL of its ``postgres`` database; stop it and delete its folder."""
    folder = Path(tempfile.mkdtemp(prefix="conductor-pg-"))
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_owner:
        shutil.chown(folder, "postgres")
    data, found = folder / "data", binaries()
    options = f"-k {folder} -c listen_addresses='' -c fsync=off -c max_connections=200"
    try:
        _run([*as_owner, found["initdb"], "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"])
        _run([*as_owner, found["pg_ctl"], "-D", str(data), "-l", str(folder / "log"), "-w", "-o", options, "start"])
        try:
            yield f"postgresql://postgres@/postgres?host={folder}"
        finally:
            _run([*as_owner, found["pg_ctl"], "-D", str(data), "-m", "immediate", "-w", "stop"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def new_database(cluster_url: str) -> str:
    """The URL of a new, empty database in the cluster at ``cluster_url``."""
    import psycopg

    name = f"test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(cluster_url, autocommit=True) as db:
        db.execute(f"CREATE DATABASE {name}")
    return cluster_url.replace("/postgres?", f"/{name}?")


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
