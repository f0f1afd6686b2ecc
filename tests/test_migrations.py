"""One migration history that works on both backends and matches the ORM."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from jigsaw.jobspec import JobSpec
from scheduler.db import make_engine, session_factory, transaction
from scheduler.migrate import current_revision, downgrade, head_revision, upgrade
from scheduler.models.jobs import submit
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import Base, CodeArchive, CodeOwner, Job


def test_upgrade_downgrade_upgrade_and_no_drift(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    assert current_revision(engine) == head_revision(engine)
    downgrade(engine, "base")
    assert current_revision(engine) is None
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
        )
    assert diff == []
    engine.dispose()


def test_concurrent_upgrades_migrate_once(db_url: str) -> None:
    """Two processes starting at once: both succeed and the schema is at head."""
    engines = [make_engine(db_url) for _ in range(2)]
    errors: list[BaseException] = []

    def run(engine: object) -> None:
        try:
            upgrade(engine)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert current_revision(engines[0]) == head_revision(engines[0])
    for e in engines:
        e.dispose()


def test_a_new_sqlite_database_waits_to_switch_to_wal_while_another_writes(
    tmp_path: Path,
) -> None:
    """SQLite refuses the switch at once, without its busy handler, while another
    connection writes in rollback mode: the concurrent upgrade above met it."""
    path = tmp_path / "jigsaw.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("CREATE TABLE t (i INTEGER)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO t VALUES (1)")
    outcome: list[object] = []

    def connect() -> None:
        try:
            with make_engine(f"sqlite:///{path}").connect() as connection:
                outcome.append(connection.exec_driver_sql("PRAGMA journal_mode").scalar())
        except Exception as exc:  # noqa: BLE001 - surfaced by the assert below
            outcome.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive() and outcome == []  # waiting, not refused
    writer.execute("COMMIT")
    thread.join()
    writer.close()
    assert outcome == ["wal"]


def test_suspensions_recorded_as_messages_get_who_suspended_them(db_url: str) -> None:
    """Jobs suspended before `suspended_by` existed keep what they wait for."""
    engine = make_engine(db_url)
    upgrade(engine)
    factory = session_factory(engine)
    rows = {  # (state, message) -> suspended_by after the migration
        ("SUSPENDED", "suspended by policy"): "policy",
        ("SUSPENDED", "suspended: its node was drained"): "drain",
        ("SUSPENDED", "suspended"): "user",
        ("RUNNING", "suspended by policy"): None,
    }
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        owner = Principal("user", user.id, user.name, False)
        ids = {}
        for state, message in rows:
            job = submit(
                session, JobSpec(name="j", workload="digits-mlp", max_iterations=10), owner
            )
            job.state, job.message = state, message
            ids[(state, message)] = job.id
    downgrade(engine, "0008")
    upgrade(engine)
    with factory() as session:
        found = {key: session.get_one(Job, job_id).suspended_by for key, job_id in ids.items()}
    assert found == rows
    engine.dispose()


def test_uploaded_code_belongs_to_the_owners_of_the_jobs_that_name_it(db_url: str) -> None:
    """Archives uploaded before `code_owners` existed stay runnable by who ran them."""
    engine = make_engine(db_url)
    upgrade(engine)
    factory = session_factory(engine)
    named, unnamed = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    with transaction(factory) as session:
        session.add_all(CodeArchive(digest=d, size=1, data=b"x") for d in (named, unnamed))
        owners = {}
        for name in ("alice", "bob", "carol"):
            user = get_or_create_user(session, name)
            owners[name] = user.id
            spec = JobSpec(name="j", workload="my_pkg.trial:T", max_iterations=10)
            if name != "carol":
                spec = spec.model_copy(update={"code": named})
            for _ in range(2):  # two jobs of one owner make one row
                submit(session, spec, Principal("user", user.id, user.name, False))
    downgrade(engine, "queues_quotas")
    upgrade(engine)
    with factory() as session:
        rows = {tuple(row) for row in session.execute(select(CodeOwner.digest, CodeOwner.user_id))}
    assert rows == {(named, owners["alice"]), (named, owners["bob"])}
    engine.dispose()
