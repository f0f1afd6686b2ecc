"""The one check of a policy's plan against the snapshot it was made from, applied by the
round loop and the simulator alike, in the order both apply a plan (suspend and stop,
reconfigure, start), each item against the state the items before it leave.

An item that cannot be applied is dropped with its reason; the rest of the plan stands.
A start is refused when its job is not waiting (a job this very plan suspends waits
again, and may move), when its size is not one its model knows, when a GPU is unknown,
repeated, or on a dead or unschedulable node, and when a GPU that others hold has not
the memory for its rank: memory is shared only as far as the co-location rule allows (a
job alone on a GPU is never refused for memory; a job without a model takes a whole GPU).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jigsaw import spb
from scheduler.core.plan import Placement, Plan, Reconfigure, Resize
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView
from scheduler.core.states import JobState, can_transition

SUSPEND = "suspend"
STOP = "stop"
RECONFIGURE = "reconfigure"
START = "start"
RESIZE = "resize"


@dataclass(frozen=True)
class Rejection:
    """A plan item that was dropped, and why."""

    action: str  # SUSPEND, STOP, RECONFIGURE, START or RESIZE
    job_id: int
    reason: str


@dataclass(frozen=True)
class Checked:
    plan: Plan  # the items that may be applied, in their order
    rejected: tuple[Rejection, ...] = ()


def validate(plan: Plan, snapshot: ClusterSnapshot) -> Checked:
    """The plan's applicable items, and the others with their reasons."""
    state = _State.of(snapshot)
    suspend = tuple(j for j in plan.suspend if state.suspend(j))
    stop = tuple(j for j in plan.stop if state.stop(j))
    reconfigure = tuple(c for c in plan.reconfigure if state.reconfigure(c))
    start = tuple(p for p in plan.start if state.start(p))
    resize = tuple(r for r in plan.resize if state.resize(r))
    return Checked(Plan(start, suspend, stop, reconfigure, resize), tuple(state.rejected))


@dataclass
class _State:
    """The jobs and GPUs as the plan's items so far leave them."""

    gpus: dict[int, GPUView]
    usable: frozenset[int]  # GPUs of alive, schedulable nodes
    jobs: dict[int, JobView]
    states: dict[int, JobState]
    preempted: set[int]
    held: dict[int, tuple[int, ...]]
    config: dict[int, Mapping[str, Any]]
    on_gpu: dict[int, list[int]]
    rejected: list[Rejection] = field(default_factory=list)

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> _State:
        on_gpu: dict[int, list[int]] = defaultdict(list)
        for node in snapshot.nodes:
            for gpu in node.gpus:
                on_gpu[gpu.id] = list(gpu.holders)
        return cls(
            gpus=snapshot.gpus_by_id(),
            usable=frozenset(
                gpu.id
                for node in snapshot.nodes
                if node.alive and node.schedulable
                for gpu in node.gpus
            ),
            jobs={job.id: job for job in snapshot.jobs},
            states={job.id: job.state for job in snapshot.jobs},
            preempted={job.id for job in snapshot.jobs if job.preempted},
            held={job.id: job.allocated_gpu_ids for job in snapshot.jobs},
            config={job.id: job.spb for job in snapshot.jobs},
            on_gpu=on_gpu,
        )

    def _reject(self, action: str, job_id: int, reason: str) -> bool:
        self.rejected.append(Rejection(action, job_id, reason))
        return False

    def _release(self, job_id: int) -> None:
        for gpu in self.held.get(job_id, ()):
            self.on_gpu[gpu].remove(job_id)
        self.held[job_id] = ()

    def suspend(self, job_id: int) -> bool:
        current = self.states.get(job_id)
        if current is not JobState.RUNNING:
            return self._reject(SUSPEND, job_id, f"not running ({current or 'unknown'})")
        self._release(job_id)
        self.states[job_id] = JobState.SUSPENDED
        self.preempted.add(job_id)
        return True

    def stop(self, job_id: int) -> bool:
        current = self.states.get(job_id)
        if current is None or not can_transition(current, JobState.FAILED):
            return self._reject(STOP, job_id, f"cannot fail from {current or 'unknown'}")
        self._release(job_id)
        self.states[job_id] = JobState.FAILED
        return True

    def reconfigure(self, change: Reconfigure) -> bool:
        current = self.states.get(change.job_id)
        if current is not JobState.RUNNING:
            return self._reject(RECONFIGURE, change.job_id, f"not running ({current or 'unknown'})")
        self.config[change.job_id] = change.spb
        return True

    def start(self, placement: Placement) -> bool:
        job_id, gpu_ids = placement.job_id, placement.gpu_ids
        reason = self._start_refusal(placement)
        if reason is not None:
            return self._reject(START, job_id, reason)
        self.states[job_id] = JobState.SCHEDULED
        self.preempted.discard(job_id)
        self.held[job_id] = tuple(gpu_ids)
        self.config[job_id] = placement.spb
        for gpu in gpu_ids:
            self.on_gpu[gpu].append(job_id)
        return True

    def resize(self, change: Resize) -> bool:
        """A running job asked to move to another gang at its boundary; whether that gang
        is still free then is the loop's check when it relaunches the job."""
        current = self.states.get(change.job_id)
        if current is not JobState.RUNNING:
            return self._reject(RESIZE, change.job_id, f"not running ({current or 'unknown'})")
        reason = self._gpus_refusal(change.gpu_ids)
        return self._reject(RESIZE, change.job_id, reason) if reason is not None else True

    def _gpus_refusal(self, gpu_ids: Sequence[int]) -> str | None:
        if not gpu_ids or len(set(gpu_ids)) != len(gpu_ids):
            return "GPUs missing or repeated"
        unusable = [gpu for gpu in gpu_ids if gpu not in self.usable]
        if unusable:
            return f"GPUs {unusable} unknown, or on a dead or unschedulable node"
        return None

    def _start_refusal(self, placement: Placement) -> str | None:
        job_id, gpu_ids = placement.job_id, placement.gpu_ids
        job = self.jobs.get(job_id)
        current = self.states.get(job_id)
        if job is None or current is None:
            return "unknown job"
        waiting = current is JobState.QUEUED or (
            current is JobState.SUSPENDED and job_id in self.preempted
        )
        if not waiting or not can_transition(current, JobState.SCHEDULED):
            return f"not waiting ({current})"
        if job.model is not None and len(gpu_ids) not in job.model.steps:
            return f"no model of it on {len(gpu_ids)} GPU(s)"
        reason = self._gpus_refusal(gpu_ids)
        if reason is not None:
            return reason
        need = self._memory(job, gpu_ids, placement.spb)
        for gpu, rank_need in zip(gpu_ids, need, strict=True):
            holders = self.on_gpu[gpu]
            used = sum(self._rank_memory(holder, gpu) for holder in holders)
            if holders and used + rank_need > self.gpus[gpu].memory_bytes:
                return f"GPU {gpu} has not the memory for it"
        return None

    def _memory(
        self, job: JobView, gpu_ids: Sequence[int], config: Mapping[str, Any]
    ) -> tuple[int, ...]:
        """Bytes of each rank: its model's, or a whole GPU when it has none."""
        if job.model is None:
            return tuple(self.gpus[gpu].memory_bytes for gpu in gpu_ids)
        nodes = len({self.gpus[gpu].node_id for gpu in gpu_ids})
        return job.model.shape(spb.resolve(config), len(gpu_ids), nodes).worker_memory_bytes

    def _rank_memory(self, job_id: int, gpu: int) -> int:
        job = self.jobs.get(job_id)
        held = self.held.get(job_id, ())
        if job is None or gpu not in held:
            return self.gpus[gpu].memory_bytes  # a holder the snapshot does not show
        return self._memory(job, held, self.config[job_id])[held.index(gpu)]
