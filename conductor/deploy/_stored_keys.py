"""API keys kept in the server's database rather than a keys file, so that every replica sees the same keys and a key
revoked through any of them (``conductor keys revoke NAME --db URL``) is refused by all at once.

A request's key is looked up by its SHA-256 (one indexed query on each request: no cache to go stale). The lookup is
by hash, not a comparison against every entry as ``KeyStore`` does: the hash of a 256-bit random key reveals nothing
an attacker can steer by timing. A revoked key keeps its row (its id stays taken, and ``list`` shows when it was
revoked), so audit rows that name it keep their meaning.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from conductor.deploy._database import Database, open_database, rows
from conductor.deploy._governance import KeySpec, has_daily_limits, hash_key
from conductor.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class StoredKey:
    """A key's entry in the database: its spec, when it was added, and when it was revoked (``None``: in use)."""

    spec: KeySpec
    created: str
    revoked: str | None


class StoredKeys:
    """The API keys in ``database`` (a SQLite path, a ``postgresql://`` URL or a ``Database``). Thread-safe; read
    afresh on every call, so changes made through another process or replica count at once."""

    def __init__(self, database: str | Path | Database):
        self.database = open_database(database)

    def add(self, spec: KeySpec) -> None:
        """Store ``spec``; a ``ConfigError`` if its id is taken (revoked keys included) or its hash is stored."""
        with self.database.transaction() as db:
            taken = db.execute("SELECT id FROM api_keys WHERE id = ? OR hash = ?", (spec.id, spec.hash)).fetchone()
            if taken is not None:
                raise ConfigError(f"the key id {spec.id!r} is already in {self.database.name}: choose another id")
            db.execute(
                "INSERT INTO api_keys (id, hash, spec, created) VALUES (?, ?, ?, ?)",
                (spec.id, spec.hash, spec.model_dump_json(), _now()),
            )

    def revoke(self, key_id: str) -> None:
        """Refuse ``key_id`` from now on, on every server using this database."""
        with self.database.transaction() as db:
            revoked = db.execute(
                "UPDATE api_keys SET revoked = ? WHERE id = ? AND revoked IS NULL", (_now(), key_id)
            ).rowcount
        if not revoked:
            known = [key.spec.id for key in self.entries() if key.revoked is None]
            raise ConfigError(f"no key {key_id!r} in use in {self.database.name}; the keys in use: {known}")

    def entries(self) -> list[StoredKey]:
        """Every key ever added, revoked ones included, in the order they were added."""
        with self.database.transaction() as db:
            found = rows(db.execute("SELECT spec, created, revoked FROM api_keys ORDER BY created, id"))
        return [StoredKey(KeySpec.model_validate_json(row["spec"]), row["created"], row["revoked"]) for row in found]

    def authenticate(self, key: str) -> KeySpec | None:
        """The spec of ``key`` if it is stored and not revoked, else ``None``."""
        with self.database.transaction() as db:
            query = "SELECT spec FROM api_keys WHERE hash = ? AND revoked IS NULL"
            row = db.execute(query, (hash_key(key),)).fetchone()
        return KeySpec.model_validate_json(row[0]) if row is not None else None

    @property
    def keys(self) -> tuple[KeySpec, ...]:
        """The keys in use now."""
        return tuple(key.spec for key in self.entries() if key.revoked is None)

    @property
    def has_daily_limits(self) -> bool:
        return has_daily_limits(self.keys)

    def close(self) -> None:
        self.database.close()

    def any_added(self) -> bool:
        """Whether a key was ever added (revoked ones count: revoking the last key must not open the server)."""
        with self.database.transaction() as db:
            return db.execute("SELECT count(*) FROM api_keys").fetchone()[0] > 0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
