"""Shared fixtures: every database test runs on SQLite and on a real PostgreSQL.

PostgreSQL tests use a fresh database per test, created on the server named by
JIGSAW_TEST_POSTGRES_URL (default: the local trust-auth server). Locally they skip when
the server is unreachable; under CI (CI=true) a skipped PostgreSQL test fails the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text

from scheduler.db import make_engine, session_factory
from scheduler.migrate import upgrade
from scheduler.models.users import AGENT_SCOPE, USER_SCOPE, get_or_create_user, issue_token
from scheduler.settings import DatabaseSettings, Settings
from tests.servers import HTTP_TIMEOUT_SECONDS, scratch_postgres, serve_app

POSTGRES_SERVER_URL = os.environ.get(
    "JIGSAW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
UNDER_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

_skipped_postgres: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "postgres" in report.keywords:
        _skipped_postgres.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if UNDER_CI and _skipped_postgres:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"FAILED: {len(_skipped_postgres)} PostgreSQL test(s) skipped under CI: "
                + ", ".join(_skipped_postgres[:5]),
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _postgres_admin_engine() -> Engine:
    return create_engine(POSTGRES_SERVER_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def postgres_available() -> bool:
    try:
        with _postgres_admin_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception:  # noqa: BLE001 - any failure means "not reachable"
        return False


@pytest.fixture
def postgres_url(postgres_available: bool) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    if not postgres_available:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_SERVER_URL}")
    with scratch_postgres(POSTGRES_SERVER_URL) as url:
        yield url


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def db_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """An empty database URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jigsaw.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A migrated database on each backend."""
    eng = make_engine(db_url)
    upgrade(eng)
    yield eng
    eng.dispose()


@dataclass(frozen=True)
class LiveApi:
    base_url: str
    alice: str
    bob: str
    root: str
    agent: str
    engine: Engine

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=HTTP_TIMEOUT_SECONDS)

    def get(self, path: str) -> httpx.Response:
        """A GET without a token (the OpenAPI schema, /metrics)."""
        with self.client(None) as anonymous:
            return anonymous.get(path)


@pytest.fixture
def live_api_settings() -> dict[str, Any]:
    """Settings sections live_api's app gets besides its database; a test changes them
    with `@pytest.mark.parametrize("live_api_settings", [{"api": APISettings(...)}])`."""
    return {}


@pytest.fixture
def live_api(
    engine: Engine, db_url: str, tmp_path: Path, live_api_settings: dict[str, Any]
) -> Iterator[LiveApi]:
    """The real app under uvicorn on a loopback port, with users alice, bob and root."""
    from api.app import create_app

    with session_factory(engine)() as session, session.begin():
        tokens = {
            name: issue_token(
                session, scope=USER_SCOPE, user=get_or_create_user(session, name, is_admin=admin)
            )
            for name, admin in (("alice", False), ("bob", False), ("root", True))
        }
        agent = issue_token(session, scope=AGENT_SCOPE)
    settings = Settings(home=tmp_path, database=DatabaseSettings(url=db_url), **live_api_settings)
    app = create_app(settings)
    try:
        with serve_app(app) as url:
            yield LiveApi(url, **tokens, agent=agent, engine=engine)
    finally:
        app.state.engine.dispose()
