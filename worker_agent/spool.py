"""The outbox's iteration records on disk, so that an agent killed while it holds some
(the scheduler was unreachable, or a batch was waiting) sends them after its restart.

An append-only file mirrors the outbox's queue of records: each `append` writes the new
records, each `consumed` notes that the oldest N left the queue (handed to a stream, or
dropped at the outbox's bound). The file is emptied whenever the queue is, and rewritten
with only what is pending once the notes outweigh it, so it stays about the size of the
queue. A write is a single `write(2)`: a SIGKILLed agent loses nothing it had written
(the page cache survives the process; a power cut is another matter), and a torn last
entry is ignored when reading.

The protocol has no acknowledgements, so a record handed to a stream just before the
kill may be sent twice; the scheduler keeps one row per replayed iteration.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from google.protobuf.message import DecodeError

from jigsaw.proto.v2 import agent_pb2

logger = logging.getLogger(__name__)

SPOOL_FILE = "reports.spool"  # in the agent's work directory
Record = tuple[int, agent_pb2.IterationRecord]  # (job id, record)

_HEADER = struct.Struct("<cI")  # kind, then payload size (records) or count (consumed)
_RECORDS, _CONSUMED = b"R", b"C"


class ReportSpool:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._consumed = 0  # records noted as consumed since the file was last rewritten
        self._closed = False

    def recover(self) -> list[Record]:
        """What a previous agent left pending, in order; the file then holds only that."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            logger.warning("cannot read the report spool %s (%s); starting afresh", self._path, exc)
            data = b""
        pending = _pending(data)
        if pending:
            logger.info("%d iteration records of an earlier run to send again", len(pending))
        self._rewrite(pending)
        return pending

    def append(self, job_id: int, records: Collection[agent_pb2.IterationRecord]) -> None:
        self._write(_entry(job_id, records))

    def consumed(self, count: int, left: int, pending: Callable[[], Iterable[Record]]) -> None:
        """The oldest `count` records left the queue; `left` remain, `pending()` yields them."""
        if not left:
            self._consumed = 0
            if self._fd is not None:
                try:
                    os.ftruncate(self._fd, 0)  # appends go on from 0: O_APPEND
                except OSError as exc:
                    self._failed(exc)
            return
        self._consumed += count
        if self._consumed > max(left, 1024):
            self._rewrite(pending())
        else:
            self._write(_HEADER.pack(_CONSUMED, count))

    def close(self) -> None:
        """Write nothing more (the agent is stopping)."""
        self._closed = True
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rewrite(self, pending: Iterable[Record]) -> None:
        """Replace the file with one holding `pending` only (atomically: a kill midway
        leaves the old file, which at worst has some records sent twice)."""
        self._close_fd()
        self._consumed = 0
        if self._closed:
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            staging = self._path.with_name(self._path.name + ".new")
            staging.write_bytes(b"".join(_entry(job_id, [record]) for job_id, record in pending))
            staging.chmod(0o600)
            os.replace(staging, self._path)
            self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._failed(exc)

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        # Without the spool the agent still works; it only loses what an agent kill loses.
        logger.error("report spool %s disabled: %s", self._path, exc)
        self._close_fd()


def _entry(job_id: int, records: Collection[agent_pb2.IterationRecord]) -> bytes:
    payload = agent_pb2.JobIterations(job_id=job_id, records=records).SerializeToString()
    return _HEADER.pack(_RECORDS, len(payload)) + payload


def _pending(data: bytes) -> list[Record]:
    records: list[Record] = []
    consumed = 0
    offset = 0
    while offset + _HEADER.size <= len(data):
        kind, size = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        if kind == _CONSUMED:
            consumed += size
            continue
        if kind != _RECORDS or offset + size > len(data):
            break  # torn by a kill mid-write, or not a spool at all
        try:
            batch = agent_pb2.JobIterations.FromString(data[offset : offset + size])
        except DecodeError:
            break
        offset += size
        records.extend((batch.job_id, record) for record in batch.records)
    return records[consumed:]
