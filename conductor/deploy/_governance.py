"""Who may use a served program, and how much: API keys, the workers each may use, and budgets per request and day.

Keys file (YAML or JSON)::

    keys:
      - id: alice                               # named in logs, errors and the audit log; not a secret
        hash: "sha256:9f86d08..."               # of the key; the key itself is never stored
        workers: [planner, solver]              # the workers its requests may use (default: all)
        budget: {max_cost: 0.05, max_tokens: 20000}   # per request (Budget fields); the server's own still applies
        daily_cost: 2.0                         # dollars per UTC day; needs budget.max_cost
        daily_tokens: 1000000                   # tokens per UTC day; needs budget.max_tokens

``conductor keys add`` writes entries. Why SHA-256 and not a slow salted hash (scrypt, PBKDF2): the keys are 256
random bits made by ``new_key``, so guessing one from its hash is hopeless without key stretching, which protects
low-entropy passwords; a per-key salt would also force a slow hash of the presented key against every entry on every
request, a CPU cost anyone can trigger. Hashes are compared with ``hmac.compare_digest`` against every entry.

Daily limits hold under concurrency, across processes and (with PostgreSQL) replicas, through ``SpendLedger``: before a
run, its worst case (its budget's ``max_cost`` and ``max_tokens``) is reserved in one transaction that locks the key's
row of the day, checks the day's limit and adds the hold (``_database`` says how each database locks); after it, the
reservation is replaced by what the run really spent. Money is counted in integer nanodollars, so ten
runs of $0.001 fill a $0.01 limit exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import yaml

from conductor.deploy._database import Database, open_database
from conductor.errors import ConductorError, ConfigError, validation_problems
from conductor.modules import Budget

HASH_PREFIX = "sha256:"
KEY_PREFIX = "cnd-"
NANO = 1_000_000_000  # nanodollars per dollar


def hash_key(key: str) -> str:
    """What a keys file stores for ``key``: ``sha256:<hex>``."""
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeySpec(pydantic.BaseModel):
    """One API key: its id, its hash, the workers it may use and its budgets (see the module docstring)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    id: str = pydantic.Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$",
        description="the key's name in logs, errors and the audit log; not a secret",
    )
    hash: str = pydantic.Field(
        pattern=rf"^{HASH_PREFIX}[0-9a-f]{{64}}$",
        description="'sha256:<hex>' of the key; the key itself is never stored",
    )
    workers: tuple[str, ...] | None = pydantic.Field(None, description="the workers its requests may use; None: all")
    budget: Budget = pydantic.Field(Budget(), description="the limits of each request; the server's own still apply")
    daily_cost: float | None = pydantic.Field(
        None, gt=0, description="dollars per UTC day, over all its requests (needs budget.max_cost); None: no limit"
    )
    daily_tokens: int | None = pydantic.Field(
        None, gt=0, description="tokens per UTC day, over all its requests (needs budget.max_tokens); None: no limit"
    )

    @pydantic.field_validator("budget")
    @classmethod
    def _not_negative(cls, budget: Budget) -> Budget:
        negative = [f.name for f in dataclasses.fields(budget) if (getattr(budget, f.name) or 0) < 0]
        if negative:
            raise ValueError(f"budget fields must not be negative: {negative}")
        return budget

    @pydantic.field_validator("daily_cost", "daily_tokens")
    @classmethod
    def _bounded_per_request(cls, limit: float | None, info: pydantic.ValidationInfo) -> float | None:
        per_request = "max_cost" if info.field_name == "daily_cost" else "max_tokens"
        budget = info.data.get("budget")  # absent when the budget itself is invalid: reported there
        if limit is not None and budget is not None and getattr(budget, per_request) is None:
            raise ValueError(f"a {info.field_name} limit needs budget.{per_request}: the most one request may reserve")
        return limit

    def allows(self, worker: str) -> bool:
        return self.workers is None or worker in self.workers


class KeyStore:
    """The server's API keys; looks a presented key up by its hash in constant time per entry."""

    def __init__(self, keys: Sequence[KeySpec]):
        ids = [key.id for key in keys]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"key ids must be unique: {ids}")
        self.keys = tuple(keys)

    @classmethod
    def from_config(cls, config: Any, *, workers: Sequence[str] | None = None, source: str = "keys") -> KeyStore:
        """Build from ``{"keys": [...]}``; with ``workers`` (the pool's names), unknown worker names are errors too.
        Every problem is reported at once in one ``ConfigError`` naming ``source``."""
        entries = config.get("keys") if isinstance(config, dict) else None
        if not isinstance(entries, list):
            raise ConfigError(f"{source} must hold a mapping with a `keys` list")
        keys, problems = [], []
        for i, entry in enumerate(entries):
            if isinstance(entry, dict) and "key" in entry:
                problems.append(
                    f"keys.{i}.key: a raw key must never be stored: store its hash (`conductor keys add` makes one)"
                )
                entry = {name: value for name, value in entry.items() if name != "key"}
            try:
                keys.append(KeySpec.model_validate(entry))
            except pydantic.ValidationError as exc:
                problems += [f"keys.{i}.{problem}" for problem in validation_problems(exc, "(entry)")]
        for field in ("id", "hash"):
            values = [entry.get(field) for entry in entries if isinstance(entry, dict) and entry.get(field)]
            repeated = sorted({value for value in values if values.count(value) > 1})
            problems += [f"the {field} {value!r} appears more than once" for value in repeated]
        if workers is not None:
            problems += worker_problems(keys, workers)
        if problems:
            raise ConfigError(f"invalid keys file {source}:\n" + "\n".join(f"  {p}" for p in problems))
        return cls(keys)

    @classmethod
    def from_file(cls, path: str | Path, *, workers: Sequence[str] | None = None) -> KeyStore:
        """Read a YAML or JSON keys file (see the module docstring)."""
        return cls.from_config(read_keys_file(path), workers=workers, source=str(path))

    def authenticate(self, key: str) -> KeySpec | None:
        """The entry of ``key``, or ``None``. Every entry is compared, so the time taken says nothing of which."""
        digest = hash_key(key)
        found = None
        for spec in self.keys:
            if hmac.compare_digest(spec.hash, digest):
                found = spec
        return found

    @property
    def has_daily_limits(self) -> bool:
        return has_daily_limits(self.keys)

    def __iter__(self) -> Iterator[KeySpec]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def has_daily_limits(keys: Iterable[KeySpec]) -> bool:
    """Whether any of ``keys`` has a daily limit (and so needs a spend ledger)."""
    return any(key.daily_cost is not None or key.daily_tokens is not None for key in keys)


def worker_problems(keys: Sequence[KeySpec], workers: Sequence[str]) -> list[str]:
    """A line for each key that names workers outside ``workers`` (the pool's names)."""
    problems = []
    for key in keys:
        unknown = [name for name in key.workers or () if name not in workers]
        if unknown:
            problems.append(f"key {key.id!r} names workers {unknown} that the pool lacks; it has {list(workers)}")
    return problems


def read_keys_file(path: str | Path) -> Any:
    """The raw content of a keys file (``{"keys": []}`` when it is empty)."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())  # YAML reads JSON too
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"can't read the keys file {path}: {exc}") from exc
    return config if config is not None else {"keys": []}


class SpendLimitExceeded(ConductorError):
    """A key's daily limit would be passed by the run's worst case; nothing was run."""


@dataclasses.dataclass(frozen=True)
class Reservation:
    """What one run holds of its key's day: ``cost`` in nanodollars and ``tokens``, on the UTC ``day`` it began."""

    key_id: str
    day: str
    cost: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class DaySpend:
    """A key's use of one UTC day: settled requests, what they spent, and what requests in flight hold."""

    requests: int = 0
    spent_cost: float = 0.0
    spent_tokens: int = 0
    held_cost: float = 0.0
    held_tokens: int = 0


class SpendLedger:
    """Per-key daily spend in ``database`` (the audit log's: a SQLite path, a ``postgresql://`` URL or a ``Database``).
    Safe across threads, processes and replicas: every change is one transaction on a connection of its own.

    A run's reservation is held until it is settled; if the process dies in between, the reservation stays held for
    the rest of that day (erring toward refusing, never toward overspending). The executor keeps a run within its
    budget by the pool's prices; a provider that reports a higher cost than those prices predict can take a day past
    its limit by the difference, and the day's later requests are then refused. ``clock`` gives the current UTC time.
    """

    def __init__(self, database: str | Path | Database, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.database = open_database(database)
        self._clock = clock

    def reserve(self, key: KeySpec, budget: Budget) -> Reservation:
        """Hold ``budget``'s worst case against ``key``'s day, or raise ``SpendLimitExceeded`` (holding nothing)."""
        unbounded = [
            name
            for name, limit in (("max_cost", key.daily_cost), ("max_tokens", key.daily_tokens))
            if limit is not None and getattr(budget, name) is None
        ]
        if unbounded:
            raise ConfigError(f"key {key.id!r} has daily limits, so a run of theirs needs budget {unbounded}")
        reservation = Reservation(key.id, self._today(), _nanodollars(budget.max_cost or 0.0), budget.max_tokens or 0)
        where = (key.id, reservation.day)
        with self.database.transaction() as db:
            # The day's row made first, so that the SELECT has a row to lock even for a key's first request of the day.
            db.execute("INSERT INTO daily_spend (key_id, day) VALUES (?, ?) ON CONFLICT DO NOTHING", where)
            used_cost, used_tokens = db.execute(
                "SELECT spent_nanodollars + held_nanodollars, spent_tokens + held_tokens FROM daily_spend "
                "WHERE key_id = ? AND day = ?" + self.database.row_lock,
                where,
            ).fetchone()
            if key.daily_cost is not None and used_cost + reservation.cost > _nanodollars(key.daily_cost):
                raise SpendLimitExceeded(
                    f"key {key.id!r} has ${(_nanodollars(key.daily_cost) - used_cost) / NANO:g} left of its daily "
                    f"${key.daily_cost:g} (runs in flight included); a request may cost up to "
                    f"${reservation.cost / NANO:g}"
                )
            if key.daily_tokens is not None and used_tokens + reservation.tokens > key.daily_tokens:
                raise SpendLimitExceeded(
                    f"key {key.id!r} has {key.daily_tokens - used_tokens:,} tokens left of its daily "
                    f"{key.daily_tokens:,} (runs in flight included); a request may use up to {reservation.tokens:,}"
                )
            db.execute(
                "UPDATE daily_spend SET held_nanodollars = held_nanodollars + ?, held_tokens = held_tokens + ? "
                "WHERE key_id = ? AND day = ?",
                (reservation.cost, reservation.tokens, *where),
            )
        return reservation

    def settle(self, reservation: Reservation, cost: float, tokens: int) -> None:
        """Replace ``reservation`` by what the run spent (``cost`` dollars, ``tokens``); on the day it began."""
        with self.database.transaction() as db:
            db.execute(
                "UPDATE daily_spend SET requests = requests + 1, held_nanodollars = held_nanodollars - ?, "
                "held_tokens = held_tokens - ?, spent_nanodollars = spent_nanodollars + ?, "
                "spent_tokens = spent_tokens + ? WHERE key_id = ? AND day = ?",
                (reservation.cost, reservation.tokens, _nanodollars(cost), tokens, reservation.key_id, reservation.day),
            )

    def day(self, key_id: str, day: str | None = None) -> DaySpend:
        """``key_id``'s use of ``day`` (``YYYY-MM-DD``, default: today in UTC)."""
        with self.database.transaction() as db:
            row = db.execute(
                "SELECT requests, spent_nanodollars, spent_tokens, held_nanodollars, held_tokens FROM daily_spend "
                "WHERE key_id = ? AND day = ?",
                (key_id, day or self._today()),
            ).fetchone()
        if row is None:
            return DaySpend()
        requests, spent, spent_tokens, held, held_tokens = row
        return DaySpend(requests, spent / NANO, spent_tokens, held / NANO, held_tokens)

    def _today(self) -> str:
        return self._clock().astimezone(UTC).date().isoformat()


def _nanodollars(dollars: float) -> int:
    return round(dollars * NANO)
