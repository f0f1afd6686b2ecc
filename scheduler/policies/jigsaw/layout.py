"""The plan being built: who is on which GPU under which SPB configuration, and what
that yields; and which running jobs are guests on another job's GPUs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from jigsaw.jobspec import SPBConfig
from scheduler.core.interference import InterferenceModel
from scheduler.core.jobmodel import Shape, colocation_stretch, stretched_step
from scheduler.core.snapshot import ClusterSnapshot, JobView
from scheduler.policies.placement import remaining_seconds


@dataclass
class Layout:
    """Who is on which GPU under which configuration."""

    interference_of: dict[int, InterferenceModel]  # GPU -> its co-location model
    node_of: dict[int, int]
    memory_of: dict[int, int]
    jobs: dict[int, JobView] = field(default_factory=dict)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)  # job -> GPUs by rank
    nodes: dict[int, int] = field(default_factory=dict)  # job -> how many nodes it spans
    config: dict[int, SPBConfig | None] = field(default_factory=dict)
    on_gpu: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def shape(self, job_id: int) -> Shape | None:
        job = self.jobs[job_id]
        if job.model is None:
            return None
        nodes = self.nodes[job_id]
        return job.model.shape(self.config[job_id], len(self.gpus[job_id]), nodes)

    def put(self, job: JobView, gpus: tuple[int, ...], config: SPBConfig | None) -> None:
        self.jobs[job.id] = job
        self.gpus[job.id] = gpus
        self.nodes[job.id] = len({self.node_of[g] for g in gpus})
        self.config[job.id] = config
        for gpu in gpus:
            self.on_gpu[gpu].append(job.id)

    def take(self, job_id: int) -> None:
        for gpu in self.gpus.pop(job_id):
            self.on_gpu[gpu].remove(job_id)
        del self.nodes[job_id]
        del self.config[job_id]
        del self.jobs[job_id]

    def utilization(self, job_id: int, gpu: int) -> float | None:
        """The job's worker's solo utilization on `gpu` (None: not measured)."""
        shape = self.shape(job_id)
        utilizations = None if shape is None else shape.utilizations
        if utilizations is None:
            return None
        return utilizations[self.gpus[job_id].index(gpu)]

    def stretch(self, job_id: int) -> list[float]:
        """How many times longer each of the job's workers computes (by rank) beside
        the co-runners on its GPUs (`scheduler.jobmodel.colocation_stretch`)."""
        factors = []
        for gpu in self.gpus[job_id]:
            on = self.on_gpu[gpu]
            if len(on) < 2:
                factors.append(1.0)
                continue
            workers = [(j, self.utilization(j, gpu)) for j in on]
            factors.append(colocation_stretch(workers, self.interference_of[gpu])[job_id])
        return factors

    def useful(self, job_id: int) -> float:
        """Useful GPUs the job yields where it is now (sharing included)."""
        job = self.jobs[job_id]
        shape = self.shape(job_id)
        if shape is None or job.model is None:
            return float(len(self.gpus[job_id]))
        step = stretched_step(shape, self.stretch(job_id))
        return job.workers * job.model.alone_step_seconds / (step * shape.steps_ratio)

    def slowdown(self, job_id: int) -> float:
        """How many times longer the job's iteration takes than with its GPUs to
        itself (1: not slowed)."""
        shape = self.shape(job_id)
        if shape is None:
            return 1.0
        return stretched_step(shape, self.stretch(job_id)) / shape.step_seconds

    def host_slowdown(self, job_id: int) -> float:
        """The job's slowdown beside its co-runners as measured on the cluster (its
        iterations beside them over those alone), else as predicted (`slowdown`). A
        measurement cannot tell which co-runner caused it, so it stands for them all."""
        measured = self.jobs[job_id].colocated_slowdown
        return measured if measured is not None else self.slowdown(job_id)


def yields(host: JobView, guest: JobView, slowdown: float, bound: float) -> bool:
    """Whether the guest should leave the host's GPUs: the host's `slowdown` beside it
    passes `bound`, and the host's loss by it over the time they would share (until the
    first of them ends) costs more than moving the guest does (its start,
    `JobView.start_seconds`; unknown, nothing). Jobs of seconds finish together: a
    restart would cost more than it saves."""
    shared = min(remaining_seconds(host), remaining_seconds(guest))
    return slowdown > bound and (slowdown - 1.0) * shared > (guest.start_seconds or 0.0)


def guests_of(snapshot: ClusterSnapshot) -> set[int]:
    """Running jobs that joined a GPU another job held first."""
    jobs = {job.id: job for job in snapshot.jobs}
    first = snapshot.now.timestamp()
    guests: set[int] = set()
    for node in snapshot.nodes:
        for gpu in node.gpus:
            if len(gpu.holders) < 2:
                continue
            since = {
                j: (held.timestamp() if (held := jobs[j].held_since) else first, j)
                for j in gpu.holders
                if j in jobs
            }
            if since:
                primary = min(since, key=since.__getitem__)
                guests.update(j for j in since if j != primary)
    return guests
