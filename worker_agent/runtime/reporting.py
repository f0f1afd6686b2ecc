"""Batches iteration records to the controller: one message per N iterations or T seconds.

The first record of a run goes out alone and at once, so that the job is seen to train
(its first metrics row) as soon as it does, not up to T seconds later.
"""

from __future__ import annotations

import time

from worker_agent.runtime.control import Controller
from worker_agent.runtime.protocol import IterationRecord


class ReportBuffer:
    def __init__(self, controller: Controller, every_iterations: int, every_seconds: float) -> None:
        self._controller = controller
        self._every_iterations = every_iterations
        self._every_seconds = every_seconds
        self._records: list[IterationRecord] = []
        self._last_flush = time.monotonic()
        self._sent_any = False

    def add(self, record: IterationRecord) -> None:
        self._records.append(record)
        if (
            not self._sent_any
            or len(self._records) >= self._every_iterations
            or time.monotonic() - self._last_flush >= self._every_seconds
        ):
            self.flush()

    def flush(self) -> None:
        if self._records:
            self._controller.report(self._records)
            self._records = []
            self._sent_any = True
        self._last_flush = time.monotonic()
