"""One scheduler loop per database: the leader lock, and the campaign for it.

Two loops on one database would place jobs on the same GPUs. On PostgreSQL the lock is a
session-level advisory lock on a connection kept open for as long as the lock is held, so
the server frees it by itself when the leader's process or connection dies. SQLite has no
such lock, so a file lock beside the database file plays its part (released by the OS
when the process dies).

High availability: every replica that may schedule runs `campaign`, which tries the lock
every `leader_retry_seconds`. The holder runs the scheduler until it stops or its lock
check fails (its lock connection broke, so the server may already have handed the lock
to another replica); then it tears the scheduler down and campaigns again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import filelock
from sqlalchemy import Connection, Engine, text

logger = logging.getLogger(__name__)

# Arbitrary constant naming "JigSaw scheduler leader" among PostgreSQL advisory locks.
LEADER_LOCK_ID = 0x4A16_5C01

# Server-side TCP keepalive of the lock's session: when the leader's host vanishes
# without closing its socket (power loss, partition), PostgreSQL notices after about
# idle + interval * count = 5 + 2 * 3 seconds and frees the lock for another replica,
# instead of after the kernel default of two hours. A SIGKILLed process needs none of
# this: its kernel closes the socket and the server frees the lock at once.
_KEEPALIVE = {"tcp_keepalives_idle": 5, "tcp_keepalives_interval": 2, "tcp_keepalives_count": 3}


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
        for name, value in _KEEPALIVE.items():
            # Not a bound parameter: SET takes none. Names and values are constants.
            connection.exec_driver_sql(f"SET {name} = {int(value)}")
        self._connection = connection
        return True

    def verify(self) -> bool:
        """Whether the lock is still held: the file lock, or the lock's PostgreSQL session
        (alive session = lock held). A broken session is dropped, and False returned."""
        if self._file is not None:
            return self._file.is_locked
        connection = self._connection
        if connection is None:
            return False
        try:
            connection.execute(text("SELECT 1"))
            return True
        except Exception:
            logger.exception("the leader lock's database session broke")
            self._connection = None
            connection.invalidate()
            connection.close()
            return False

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


def campaign(
    lock: LeaderLock,
    lead: Callable[[threading.Event, Callable[[], bool]], None],
    stop: threading.Event,
    retry_seconds: float,
) -> None:
    """Until `stop`: take the lock when free, then `lead(stop, lock.verify)` while held.

    `lead` runs the scheduler and returns when `stop` is set or the check fails; the lock
    is released (if still held) after it returns or raises, and the campaign goes on.
    """
    announced = False
    while not stop.is_set():
        try:
            leading = lock.acquire(blocking=False)
        except Exception:
            logger.exception("could not try the scheduler leader lock; retrying")
            leading = False
        if leading:
            announced = False
            logger.info("became the scheduler leader (%s)", lock.describe())
            try:
                lead(stop, lock.verify)
            except Exception:
                logger.exception("the scheduler failed; giving up the leader lock")
            finally:
                lock.release()
            if not stop.is_set():
                logger.warning("stepped down as scheduler leader; campaigning again")
        elif not announced:
            logger.info(
                "another replica leads the scheduler (%s); serving the API and retrying "
                "every %.1f s",
                lock.describe(),
                retry_seconds,
            )
            announced = True
        stop.wait(retry_seconds)
