"""One scheduler loop per database: the leader lock.

Two loops on one database would place jobs on the same GPUs. On PostgreSQL the lock is a
session-level advisory lock on a connection kept open for as long as the lock is held, so
the server frees it by itself when the leader's process or connection dies. SQLite has no
such lock, so a file lock beside the database file plays its part (released by the OS
when the process dies).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType

import filelock
from sqlalchemy import Connection, Engine, text

logger = logging.getLogger(__name__)

# Arbitrary constant naming "JigSaw scheduler leader" among PostgreSQL advisory locks.
LEADER_LOCK_ID = 0x4A16_5C01


class LeaderUnavailable(RuntimeError):
    """Another scheduler already leads this database."""


def sqlite_lock_path(engine: Engine, home: Path) -> Path:
    """`<db file>.scheduler.lock`; an in-memory database locks under `home` instead."""
    database = engine.url.database
    if not database or database == ":memory:":
        return home / "scheduler.lock"
    return Path(f"{database}.scheduler.lock")


class LeaderLock:
    def __init__(self, engine: Engine, home: Path) -> None:
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        self._connection: Connection | None = None
        self._file: filelock.FileLock | None = None
        if not self._postgres:
            path = sqlite_lock_path(engine, home)
            path.parent.mkdir(parents=True, exist_ok=True)
            # Not thread-local: `jigsaw up` takes the lock in one thread and the loop
            # thread may be the one that gives it back.
            self._file = filelock.FileLock(path, thread_local=False)

    @property
    def held(self) -> bool:
        if self._file is not None:
            return self._file.is_locked
        return self._connection is not None

    def describe(self) -> str:
        if self._file is not None:
            return f"file lock {self._file.lock_file}"
        return f"PostgreSQL advisory lock {LEADER_LOCK_ID:#x} on {self._engine.url.database}"

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock; without `blocking`, False at once when another scheduler has it."""
        if self.held:
            return True
        if self._file is not None:
            try:
                self._file.acquire(blocking=blocking)
            except filelock.Timeout:
                return False
            return True
        # AUTOCOMMIT: the lock belongs to the session, and an open transaction held for
        # the loop's lifetime would pin old row versions (VACUUM could not clean them).
        connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        function = "pg_advisory_lock" if blocking else "pg_try_advisory_lock"
        try:
            got = connection.execute(
                text(f"SELECT {function}(:id)"), {"id": LEADER_LOCK_ID}
            ).scalar()
        except BaseException:
            connection.close()
            raise
        # pg_advisory_lock returns void (None) once it has the lock.
        if got is False:
            connection.close()
            return False
        self._connection = connection
        return True

    def release(self) -> None:
        if self._file is not None:
            if self._file.is_locked:
                self._file.release()
            return
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": LEADER_LOCK_ID})
        except Exception:
            # Never hand a connection that may still hold the lock back to the pool.
            logger.exception("could not release the leader lock; dropping its connection")
            connection.invalidate()
        finally:
            connection.close()

    def __enter__(self) -> LeaderLock:
        if not self.acquire(blocking=False):
            raise LeaderUnavailable(
                f"another scheduler is already running against this database ({self.describe()})"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
