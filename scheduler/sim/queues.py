"""Queues for a simulation: the quota layer's queues from a file, and which queue each
trace job belongs to (its trace's `queue` column, else the first rule matching its
name, else default).

    queues:
      - {name: team-a, quota: 8, borrowing_limit: 8, weight: 1, jobs: "^a-"}
      - {name: team-b, quota: 8, jobs: "^b-"}
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scheduler.core.quota import DEFAULT_QUEUE, Queue, Quotas
from scheduler.sim.trace import TraceJob

_NAME = r"^[A-Za-z0-9][-_.A-Za-z0-9]{0,63}$"


class QueueFileError(ValueError):
    """A queues file that cannot be used, with the field path of what is wrong."""


class _QueueEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=_NAME)
    quota: int | None = Field(default=None, ge=0)
    borrowing_limit: int | None = Field(default=None, ge=0)
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    parent: str | None = Field(default=None, pattern=_NAME)
    jobs: str | None = Field(default=None, description="Regex on trace job names.")

    @field_validator("jobs")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value


class _QueueFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    queues: list[_QueueEntry] = Field(min_length=1)


class SimQueues:
    def __init__(self, data: Any) -> None:
        try:
            parsed = _QueueFile.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "queues"
            raise QueueFileError(f"{where}: {first['msg']}") from None
        names = [entry.name for entry in parsed.queues]
        if len(set(names)) != len(names):
            raise QueueFileError("queues: a name appears twice")
        by_name = {entry.name: entry for entry in parsed.queues}
        for index, entry in enumerate(parsed.queues):
            parent = by_name.get(entry.parent) if entry.parent is not None else None
            if entry.parent is not None and (parent is None or parent.parent is not None):
                raise QueueFileError(
                    f"queues.{index}.parent: {entry.parent} is not a top-level queue of the file"
                )
        self.quotas = Quotas(
            Queue(e.name, e.quota, e.borrowing_limit, e.weight, e.parent) for e in parsed.queues
        )
        self._rules = [(re.compile(e.jobs), e.name) for e in parsed.queues if e.jobs is not None]

    def assign(self, jobs: list[TraceJob]) -> list[TraceJob]:
        """Each job in its queue; a trace naming a queue the file lacks is refused."""
        assigned = []
        for job in jobs:
            queue = job.queue
            if queue == DEFAULT_QUEUE:
                queue = next((n for rule, n in self._rules if rule.search(job.name)), queue)
            elif queue not in self.quotas.queues:
                raise QueueFileError(f"job {job.name}: queue {queue} is not in the queues file")
            assigned.append(replace(job, queue=queue))
        return assigned
