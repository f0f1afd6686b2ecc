"""What one scheduling round did: its tallies and the decisions it made, in order.

The loop appends a `Decision` each time it acts on a job or node; the leader stores each
round (`scheduler.models.rounds`) for the dashboard's scheduler view and counts the
decisions in Prometheus by kind. A decision is a kind, an optional job and free-form
details, so a policy that adds a kind (`pack`, `resize`, ...) needs no schema or API
change: its decisions simply appear.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

# The kinds the loop makes today. A kind is a free string; these are the known ones.
LEASE = "lease"  # a queued job placed on GPUs for a lease of iterations, and launched
LAUNCH_REFUSED = "launch_refused"  # placed, but its agents refused: back to the queue
SUSPEND = "suspend"  # the policy suspended a running job, freeing its GPUs
STOP = "stop"  # the policy gave up on a job (it fails)
REQUEUE = "requeue"  # a job lost its processes (agent lost, crash retry) and waits again
RELEASE = "release"  # GPUs of a job that ended or was suspended through the API, freed
AGENT_LOST = "agent_lost"  # an agent stopped heartbeating; its node offers nothing
RECONFIGURE = "reconfigure"  # a running job keeps its GPUs under a new SPB configuration
CAP = "cap"  # a running job's memory cap lowered to what it has shown it needs
RESIZE = "resize"  # a running elastic job asked to checkpoint for another gang
RESIZED = "resized"  # ... relaunched there; its measured cost in the details
UNPLACEABLE = "unplaceable"  # a waiting job asks for more GPUs than the cluster can gang


@dataclass(frozen=True)
class Decision:
    kind: str
    job_id: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """`{"kind": ..., "job_id": ..., **detail}`: one flat object per decision."""
        return {"kind": self.kind, "job_id": self.job_id, **self.detail}


@dataclass(frozen=True)
class RoundResult:
    started_at: datetime | None = None  # the round's clock (simulated in tests)
    reports: int = 0  # reports ingested
    finished: int = 0  # jobs that succeeded or failed
    agents_lost: int = 0
    requeued: int = 0  # jobs sent back to the queue: agent lost, or their processes gone
    released: int = 0  # ended jobs (e.g. cancelled) whose GPUs were freed
    started: int = 0  # placements launched and running
    suspended: int = 0
    stopped: int = 0  # jobs the policy gave up on
    reconfigured: int = 0  # running jobs given a new SPB configuration
    conflicts: int = 0  # transitions lost to a concurrent change
    seconds: float = 0.0
    decisions: tuple[Decision, ...] = ()

    def counts(self) -> dict[str, int]:
        """The integer tallies, for storage and logs."""
        values = asdict(self)
        return {f.name: values[f.name] for f in fields(self) if isinstance(values[f.name], int)}
