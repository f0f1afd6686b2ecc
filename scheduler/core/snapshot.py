"""An immutable picture of the cluster for one scheduling round.

Policies see only these frozen views, never ORM objects, so they stay pure functions that
unit tests can drive without a database, and cannot change state behind the loop's back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from jigsaw.gpus import PAIR
from jigsaw.jobspec import SPBSetting
from scheduler.core.jobmodel import JobModel
from scheduler.core.states import JobState

# Jobs a policy may act on: waiting for GPUs, or holding them.
ACTIVE_STATES: tuple[JobState, ...] = (
    JobState.QUEUED,
    JobState.SCHEDULED,
    JobState.RUNNING,
    JobState.SUSPENDED,
)


@dataclass(frozen=True)
class GPUView:
    id: int
    node_id: int
    node_name: str
    index: int
    kind: str
    memory_bytes: int
    holders: tuple[int, ...] = ()  # ids of jobs holding an active allocation on it
    max_jobs: int = PAIR  # jobs it runs at once (its agent's setting): packing's limit


@dataclass(frozen=True)
class NodeView:
    id: int
    name: str
    alive: bool
    gpus: tuple[GPUView, ...] = ()
    # False on a node operators keep new work off (cordoned or tainted in Kubernetes, or
    # drained by an admin).
    schedulable: bool = True
    address: str = ""  # where peers on other nodes reach it (torch.distributed rendezvous)

    def free_gpus(self) -> tuple[GPUView, ...]:
        """GPUs a new job could take: none on a dead or unschedulable node, else those
        nobody holds."""
        if not (self.alive and self.schedulable):
            return ()
        return tuple(gpu for gpu in self.gpus if not gpu.holders)


@dataclass(frozen=True)
class JobView:
    id: int
    state: JobState
    priority: int
    workers: int
    created_at: datetime
    allocated_gpu_ids: tuple[int, ...] = ()  # ordered by rank
    # What its `max_iterations` counts done: iterations, or for an adaptive batch steps
    # of its base batch (a step at a larger batch counts AdaScale's gain).
    iterations_done: int = 0
    # The SPB configuration of its current hold (`{}`: off, or holding no GPUs).
    spb: dict[str, Any] = field(default_factory=dict)
    attained_gpu_seconds: float = 0.0  # GPUs x seconds held over all its holds so far
    restarts: int = 0  # launches after its first (a suspension, a move, a retry)
    held_since: datetime | None = None  # when its current hold began (None: holds none)
    preempted: bool = False  # SUSPENDED by a policy: waiting to be placed again
    model: JobModel | None = None  # what is known of its speed (None: nothing)
    # How many times longer its iterations took beside co-runners on its GPU than alone,
    # as measured on the cluster (None: not measured; the simulator measures nothing).
    colocated_slowdown: float | None = None
    # Its spec's SPB setting: off, a fixed configuration, or auto (the policy chooses;
    # the simulator's traces carry no setting and leave it to the policy).
    spb_setting: SPBSetting = "auto"
    max_iterations: int | None = None  # its spec's (None: it ends at a target metric)
    # The worker counts it may run on, largest first (empty: `workers` alone).
    sizes: tuple[int, ...] = ()
    queue: str = "default"  # the queue it was submitted to (scheduler.core.quota)
    # What moving it to another size is expected to cost in seconds (the checkpoint,
    # the restart, the time no iteration runs): on the cluster the mean of the measured
    # `resized` events (its own, else the cluster's recent ones), in the simulator its
    # restart; None: not known, and charged as a start (`start_seconds`).
    resize_seconds: float | None = None
    # What growing it in place (onto more GPUs of its one node, `scheduler.resize`) is
    # expected to cost: measured as `resize_seconds` is, from such growths; in the
    # simulator `SimOptions.grow_seconds`; None: charged as any move.
    grow_seconds: float | None = None
    # What starting it (again) is expected to cost, from placement to its first iteration:
    # on the cluster the mean of the recent starts measured there; None (the simulator,
    # whose jobs run for hours): charged as nothing in the order.
    start_seconds: float | None = None
    # The memory each of its ranks may use on a GPU it holds, as its agents count it
    # (the whole GPU for a job launched before it reported, until the loop lowers it);
    # None: not capped (not running on the cluster, or in the simulator).
    memory_cap_bytes: int | None = None

    @cached_property
    def waiting(self) -> bool:
        """Wants GPUs: queued, or suspended by a policy."""
        return self.state is JobState.QUEUED or (
            self.state is JobState.SUSPENDED and self.preempted
        )

    @cached_property
    def holding(self) -> bool:
        return self.state in (JobState.SCHEDULED, JobState.RUNNING)


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]
    now: datetime
    # When the newest job of all (finished ones included) was submitted (None: unknown).
    # How long the queue has gone without new work tells a policy whether the backlog
    # is all there is to finish (JigSaw paces its longest jobs then).
    last_submitted_at: datetime | None = None

    def alive_nodes(self) -> tuple[NodeView, ...]:
        return tuple(node for node in self.nodes if node.alive)

    def alive_gpu_count(self) -> int:
        """Every GPU on an alive node, held or not: the most any one job could get."""
        return sum(len(node.gpus) for node in self.alive_nodes())

    def free_gpus_by_node(self) -> dict[int, tuple[GPUView, ...]]:
        """Free GPUs of each alive node that has any, keyed by node id."""
        free = {node.id: node.free_gpus() for node in self.nodes}
        return {node_id: gpus for node_id, gpus in free.items() if gpus}

    def gpus_by_id(self) -> dict[int, GPUView]:
        return {gpu.id: gpu for node in self.nodes for gpu in node.gpus}

    def jobs_in(self, state: JobState) -> tuple[JobView, ...]:
        return tuple(job for job in self.jobs if job.state is state)

    @property
    def seconds(self) -> float:
        """`now` in seconds since the epoch, for policies that count durations."""
        return self.now.timestamp()
