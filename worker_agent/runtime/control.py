"""Who decides at iteration boundaries: the `Controller` rank 0 consults.

Only rank 0 calls `check`, `report` and `evaluation`; the loop broadcasts each decision
to its peers so that every rank acts at the same boundary. Every rank calls `shrunk` at
an in-place shrink's boundary, and `exit` last.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Client, Connection
from typing import Any, Protocol

from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.protocol import (
    Action,
    Decision,
    ExitStatus,
    IterationRecord,
    assigned_config,
    parse_address,
    shrunk_message,
)


class Controller(Protocol):
    def check(self, iteration: int) -> Decision:
        """The decision at boundary `iteration` (iterations completed so far)."""
        ...

    def report(self, records: list[IterationRecord]) -> None: ...

    def evaluation(self, iteration: int, metrics: dict[str, float]) -> None: ...

    def profile(self, workload: str, profile: dict[str, Any]) -> None:
        """The model's per-stage costs (`jigsaw.spb.SPBProfile` as JSON)."""
        ...

    def shrunk(self, iteration: int) -> WorkerConfig | None:
        """This rank's configuration in the gang an in-place shrink leaves at boundary
        `iteration` (its checkpoint written, its group left), or None: it leaves."""
        ...

    def exit(self, status: ExitStatus) -> None: ...


@dataclass
class LocalController:
    """An in-process controller with a fixed script, for tests and benchmarks.

    It records every call so tests can check who called what.
    """

    suspend_at: int | None = None
    stop_at: int | None = None
    shrink_at: int | None = None
    shrink_to: WorkerConfig | None = None  # this rank's place after the shrink (None: leave)
    # Boundary -> new configuration, each bumping config_version by one.
    reconfigure_at: dict[int, dict[str, Any]] = field(default_factory=dict)
    checks: list[int] = field(default_factory=list)
    records: list[IterationRecord] = field(default_factory=list)
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    status: ExitStatus | None = None
    shrunk_at: int | None = None
    _config_version: int = 0
    _config: dict[str, Any] = field(default_factory=dict)

    def check(self, iteration: int) -> Decision:
        self.checks.append(iteration)
        if iteration in self.reconfigure_at:
            self._config_version += 1
            self._config = self.reconfigure_at[iteration]
        action = Action.CONTINUE
        if iteration == self.stop_at:
            action = Action.STOP
        elif iteration == self.suspend_at:
            action = Action.SUSPEND
        elif iteration == self.shrink_at:
            action = Action.SHRINK
        return Decision(action, self._config_version, self._config, lease_until=iteration + 1)

    def report(self, records: list[IterationRecord]) -> None:
        self.records.extend(records)

    def evaluation(self, iteration: int, metrics: dict[str, float]) -> None:
        self.evaluations.append((iteration, metrics))

    def profile(self, workload: str, profile: dict[str, Any]) -> None:
        self.profiles.append(profile)

    def shrunk(self, iteration: int) -> WorkerConfig | None:
        self.shrunk_at = iteration
        self.shrink_at = None
        return self.shrink_to

    def exit(self, status: ExitStatus) -> None:
        self.status = status


class ConnectionController:
    """Speaks `protocol` to the node agent over a `multiprocessing.connection`."""

    def __init__(self, connection: Connection, job_id: int, rank: int) -> None:
        self._connection = connection
        self._decision: Decision | None = None
        connection.send({"type": "hello", "job_id": job_id, "rank": rank, "pid": os.getpid()})

    @classmethod
    def connect(cls, address: str, authkey: bytes, job_id: int, rank: int) -> ConnectionController:
        return cls(Client(parse_address(address), authkey=authkey), job_id, rank)

    def check(self, iteration: int) -> Decision:
        """The first boundary asks the agent; after that the agent sends every change of
        the decision unasked, and a boundary only reads what arrived (no round trip)."""
        if self._decision is None:
            self._connection.send({"type": "check", "iteration": iteration})
            self._decision = Decision.from_message(self._connection.recv())
        while self._connection.poll():
            self._decision = Decision.from_message(self._connection.recv())
        held = self._decision
        # Any boundary may bring a change, so the peers agree at every one.
        return replace(held, lease_until=iteration + 1)

    def report(self, records: list[IterationRecord]) -> None:
        self._connection.send(
            {"type": "report", "records": [record.to_message() for record in records]}
        )

    def evaluation(self, iteration: int, metrics: dict[str, float]) -> None:
        self._connection.send({"type": "evaluation", "iteration": iteration, "metrics": metrics})

    def profile(self, workload: str, profile: dict[str, Any]) -> None:
        self._connection.send({"type": "profile", "workload": workload, "profile": profile})

    def shrunk(self, iteration: int) -> WorkerConfig | None:
        """Ask the agent; the decisions it sent meanwhile were the old run's, and the new
        run's first check asks afresh."""
        self._connection.send(shrunk_message(iteration))
        self._decision = None
        while True:
            message = self._connection.recv()
            kind = message.get("type")
            if kind == "leave":
                return None
            if kind == "assign":
                return WorkerConfig.model_validate(assigned_config(message))

    def exit(self, status: ExitStatus) -> None:
        try:
            self._connection.send(
                {
                    "type": "exit",
                    "status": status.outcome.value,
                    "iteration": status.iteration,
                    "error_tail": status.error_tail,
                }
            )
        finally:
            self._connection.close()
