"""Fixtures of the deployment tests: a PostgreSQL cluster for the session, and a fresh database in it per test."""

from collections.abc import Iterator

import pytest

from tests.deploy import postgres


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[str]:
    """The URL of a throwaway cluster's ``postgres`` database; the test skips where PostgreSQL isn't installed."""
    missing = [name for name, path in postgres.binaries().items() if path is None]
    if missing:
        pytest.skip(f"PostgreSQL's {missing} are not installed (Debian: apt-get install postgresql)")
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'dspy-conductor[postgres]'")
    with postgres.cluster() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_cluster: str) -> str:
    """The URL of a new, empty database, this test's alone."""
    return postgres.new_database(postgres_cluster)
