"""What the agent still has to tell the scheduler, kept across reconnections.

Iteration records are batched across jobs (one `IterationReports` per flush). While the
scheduler is unreachable, records, evaluations, profiles, shrinks and log lines are
buffered up to a bound (the oldest are dropped and counted); job exits are never
dropped. With `first_records_at_once` (what the agent uses) the first records of a job's
run (since its last exit) are due at once rather than after the batching delay: the
scheduler then sees the job start training as soon as it does. So are records put as
`urgent` (a run's last before an in-place shrink and its first after, whose times the
scheduler measures the shrink by).

With a `ReportSpool`, the queue of iteration records is mirrored on disk: an agent
killed with records queued sends them after its restart, marked `replayed`.

The protocol has no acknowledgements: a message written just before a stream broke may be
lost with it. Exits are not sent again on the next stream, since a stale exit could end a
later run of the job; the scheduler instead learns from the next Hello that the job's
processes are gone here. Exits that were never sent travel in that Hello.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TypeVar

from jigsaw.proto.v2 import agent_pb2
from worker_agent.spool import ReportSpool
from worker_agent.wire import Outbound

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class Outbox:
    def __init__(
        self,
        *,
        batch_records: int = 512,
        batch_seconds: float = 0.5,
        max_records: int = 20_000,
        max_other: int = 2_000,
        first_records_at_once: bool = False,
        spool: ReportSpool | None = None,
    ) -> None:
        self._batch_records = batch_records
        self._batch_seconds = batch_seconds
        self._max_records = max_records
        self._max_other = max_other
        self._first_records_at_once = first_records_at_once
        self._changed = threading.Condition()
        # (job id, record, replayed: from the spool of an earlier run of the agent)
        self._records: deque[tuple[int, agent_pb2.IterationRecord, bool]] = deque()
        self._records_since: float | None = None  # when the oldest unsent record came
        self._spool = spool
        self._other: deque[
            agent_pb2.Evaluation
            | agent_pb2.LogTail
            | agent_pb2.ModelProfileReport
            | agent_pb2.JobShrunk
        ] = deque()
        self._exits: deque[agent_pb2.JobExit] = deque()
        # Jobs whose run has sent records; its exit ends the run (a resume is a new run).
        self._reporting: set[int] = set()
        self._first_records = False  # records due at once are waiting: send now
        self.dropped = 0
        if spool is not None:
            self._records.extend((job_id, record, True) for job_id, record in spool.recover())
            if self._records:
                self._records_since = time.monotonic()
                self._first_records = True

    def put(self, item: Outbound, *, urgent: bool = False) -> None:
        """Queue `item`; `urgent` records are due at once."""
        with self._changed:
            if isinstance(item, agent_pb2.JobExit):
                self._exits.append(item)
                self._reporting.discard(item.job_id)
            elif isinstance(item, agent_pb2.JobIterations):
                if item.job_id not in self._reporting:
                    self._reporting.add(item.job_id)
                    self._first_records |= self._first_records_at_once
                self._first_records |= urgent
                if self._records_since is None:
                    self._records_since = time.monotonic()
                dropped = self.dropped
                for record in item.records:
                    self._append_bounded(
                        self._records, (item.job_id, record, False), self._max_records
                    )
                if self._spool is not None:
                    self._spool.append(item.job_id, item.records)
                    if self.dropped > dropped:
                        self._spool.consumed(
                            self.dropped - dropped, len(self._records), self._pending
                        )
            else:
                self._append_bounded(self._other, item, self._max_other)
            self._changed.notify_all()

    def next_message(
        self, timeout: float, abandon: threading.Event
    ) -> agent_pb2.AgentMessage | None:
        """The next message to send, waiting up to `timeout`; None once `abandon` is set.

        Due iteration records go first, and always before exits, so that the scheduler
        has a job's last iterations when its exit arrives.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not abandon.is_set():
                now = time.monotonic()
                if self._records and (self._records_due(now) or self._exits):
                    return self._take_reports()
                if self._other:
                    other = self._other.popleft()
                    if isinstance(other, agent_pb2.Evaluation):
                        return agent_pb2.AgentMessage(evaluation=other)
                    if isinstance(other, agent_pb2.ModelProfileReport):
                        return agent_pb2.AgentMessage(profile=other)
                    if isinstance(other, agent_pb2.JobShrunk):
                        return agent_pb2.AgentMessage(shrunk=other)
                    return agent_pb2.AgentMessage(log=other)
                if self._exits:
                    return agent_pb2.AgentMessage(exit=self._exits.popleft())
                if now >= deadline:
                    return None
                wake = deadline
                if self._records_since is not None:
                    wake = min(wake, self._records_since + self._batch_seconds)
                self._changed.wait(max(wake - now, 0.0))
            return None

    def take_exits(self) -> list[agent_pb2.JobExit]:
        """Every exit not yet sent, for the next Hello (see agent.proto)."""
        with self._changed:
            exits = list(self._exits)
            self._exits.clear()
            return exits

    def wake(self) -> None:
        """Make waiting `next_message` calls look at their `abandon` event now."""
        with self._changed:
            self._changed.notify_all()

    def _records_due(self, now: float) -> bool:
        assert self._records_since is not None
        return (
            self._first_records
            or len(self._records) >= self._batch_records
            or now - self._records_since >= self._batch_seconds
        )

    def _take_reports(self) -> agent_pb2.AgentMessage:
        by_job: dict[tuple[int, bool], agent_pb2.JobIterations] = {}
        taken = min(self._batch_records, len(self._records))
        for _ in range(taken):
            job_id, record, replayed = self._records.popleft()
            by_job.setdefault(
                (job_id, replayed), agent_pb2.JobIterations(job_id=job_id, replayed=replayed)
            ).records.append(record)
        self._records_since = time.monotonic() if self._records else None
        self._first_records = False
        if self._spool is not None:
            self._spool.consumed(taken, len(self._records), self._pending)
        return agent_pb2.AgentMessage(reports=agent_pb2.IterationReports(jobs=by_job.values()))

    def _pending(self) -> Iterator[tuple[int, agent_pb2.IterationRecord]]:
        return ((job_id, record) for job_id, record, _ in self._records)

    def _append_bounded(self, buffer: deque[_T], item: _T, bound: int) -> None:
        if len(buffer) >= bound:
            buffer.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning(
                    "the scheduler is not keeping up or unreachable: %d buffered reports and "
                    "log lines dropped so far (oldest first)",
                    self.dropped,
                )
        buffer.append(item)
