"""Engine and session factory for the embedded SQLite file or PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _set_sqlite_pragmas(busy_timeout_ms: int) -> Any:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # WAL lets the API read while the scheduler writes (one writer, many readers).
        _journal_to_wal(cursor, time.monotonic() + busy_timeout_ms / 1000)
        # SQLite ignores FOREIGN KEY clauses unless asked, per connection.
        cursor.execute("PRAGMA foreign_keys=ON")
        # Writers from the API and the scheduler queue for the lock instead of failing
        # at once with "database is locked".
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        # WAL makes NORMAL durable against crashes of the process (not of the OS), which
        # is the embedded default's promise, at a fraction of FULL's fsyncs.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return on_connect


def _journal_to_wal(cursor: Any, deadline: float) -> None:
    """Set WAL mode, waiting for it until `deadline`. Switching a fresh database needs
    its exclusive lock, and SQLite answers "database is locked" at once, without the
    busy handler, while another connection writes in rollback mode or switches too (a
    deadlock it will not wait on): two processes opening a new database together met
    it (`tests/test_migrations.py`), so a refused switch is tried again."""
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _private_sqlite_file(path: Path) -> None:
    """Create the database file readable by its owner only, in a directory only its owner
    may enter; tighten an older one. SQLite gives the WAL and shared-memory files the
    database's mode, and those left by an older one are tightened too."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Only a file that does not exist yet is opened here (an empty file is an empty DB):
    # closing any descriptor of a database file drops every SQLite lock this process
    # holds on it, and a connection of another engine may hold some.
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for file in (path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
        try:
            info = file.stat()
        except FileNotFoundError:
            continue
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            file.chmod(0o600)


def _begin_immediate(conn: Any) -> None:
    # pysqlite's default deferred BEGIN upgrades to a write lock mid-transaction, which
    # deadlocks two writers; BEGIN IMMEDIATE takes the lock up front so busy_timeout works.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(
    url: str,
    *,
    busy_timeout_ms: int = 30_000,
    pool_size: int = 10,
    max_overflow: int = 20,
    echo: bool = False,
) -> Engine:
    if is_sqlite(url):
        path = make_url(url).database
        if path and path != ":memory:" and not path.startswith("file:"):
            _private_sqlite_file(Path(path))
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
            # SQLite admits one writer, and every transaction here takes the write lock
            # (BEGIN IMMEDIATE). With one pooled connection, threads of this process queue
            # on the pool's condition variable in order; with several, they would poll in
            # SQLite's busy handler, which sleeps up to 100 ms between tries (measured:
            # it dominated request latency under 32 concurrent clients).
            poolclass=QueuePool,
            pool_size=1,
            max_overflow=0,
            pool_timeout=busy_timeout_ms / 1000,
        )
        event.listen(engine, "connect", _set_sqlite_pragmas(busy_timeout_ms))
        # Take over transaction control from pysqlite so BEGIN IMMEDIATE is ours to issue.
        event.listen(
            engine,
            "connect",
            lambda dbapi_conn, _rec: setattr(dbapi_conn, "isolation_level", None),
        )
        event.listen(engine, "begin", _begin_immediate)
        return engine
    return create_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
    )


def engine_from_settings(settings: Any) -> Engine:
    db = settings.database
    return make_engine(
        settings.database_url,
        busy_timeout_ms=db.busy_timeout_ms,
        pool_size=db.pool_size,
        max_overflow=db.max_overflow,
        echo=db.echo,
    )


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception."""
    with factory() as session, session.begin():
        yield session
