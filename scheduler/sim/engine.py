"""The simulator: the scheduler's policies over a simulated clock and simulated nodes.

One round is what the real loop does (`scheduler.loop`): jobs that finished leave
their GPUs, new jobs queue, the cluster is snapshotted into the same frozen views, the
same policy function returns a `Plan`, and the plan is applied in the loop's order
(suspend and stop, reconfigure, start), checked by the same validator
(`scheduler.core.validate`). What differs is the store: jobs and GPUs live in
memory here, not in the database, because a replay of 80,000 jobs cannot afford a
transaction per decision.

Time moves by events at lease granularity: rounds fall on multiples of
`round_seconds` (one lease), at the first boundary after a job arrives or finishes,
and every boundary while some job waits (a preemptive policy may act then); with
`event_rounds`, at the arrival or end itself. Between
rounds every running job trains at a constant speed, so its progress and finish time
are computed, never stepped iteration by iteration.

With `adaptive_batch`, jobs of the Pollux applications adapt their batch size and
progress by goodput (`scheduler.sim.adaptive`): a job's model, in steps of its base
batch's statistical progress, is rebuilt whenever it enters a new epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from jigsaw import spb
from jigsaw.gpus import PAIR
from jigsaw.spb import SPBProfile
from scheduler.core.interference import Sharing, fitted
from scheduler.core.jobmodel import JobModel, Shape, colocation_stretch, stretched_step
from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView, NodeView
from scheduler.core.states import JobState
from scheduler.core.validate import validate
from scheduler.policies import Policy
from scheduler.sim import adaptive
from scheduler.sim.gpus import DEVICE_NAMES, SimGPU, measured_solo
from scheduler.sim.profiles import memory_per_gpu, profile_for
from scheduler.sim.trace import MeasuredSpeed, TraceJob

EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


class SimulationStuck(RuntimeError):
    """The policy leaves jobs waiting on an idle cluster forever."""


@dataclass(frozen=True)
class ClusterShape:
    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int = 16 << 30

    @classmethod
    def parse(cls, text: str, gpu_memory_gib: float = 16.0) -> ClusterShape:
        """`16x4`: 16 nodes of 4 GPUs each."""
        nodes, sep, per_node = text.lower().partition("x")
        if not sep or not nodes.isdigit() or not per_node.isdigit():
            raise ValueError(f"cluster shape must look like 16x4 (nodes x GPUs), got {text!r}")
        if int(nodes) < 1 or int(per_node) < 1:
            raise ValueError(f"cluster shape needs at least one node and one GPU: {text!r}")
        if gpu_memory_gib <= 0:
            raise ValueError(f"GPU memory must be positive, got {gpu_memory_gib}")
        return cls(int(nodes), int(per_node), int(gpu_memory_gib * (1 << 30)))

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class SimOptions:
    round_seconds: float = 60.0  # one lease
    restart_seconds: float = 30.0  # a (re)started job's setup and checkpoint restore
    # What a growth in place costs (a job moved onto more GPUs of its one node, all it
    # held among them, its first GPU first, as the cluster grows a gang in place), as
    # the policy is charged it too: None, a restart like any move.
    grow_seconds: float | None = None
    gpu: SimGPU = SimGPU.T4  # what step times, utilization and memory are measured on
    sharing: Sharing = Sharing.TIME_SLICING  # how co-located jobs share a GPU
    max_jobs_per_gpu: int = PAIR  # jobs a GPU runs at once
    zero_arrivals: bool = False  # submit the whole workload at time 0
    spb_profiles: dict[str, SPBProfile] = field(default_factory=dict)  # measured, by name
    # Pollux jobs adapt their batch size and progress by goodput (the Pollux artifact's
    # setting for its adaptive jobs); off, each runs at the batch its trace row asks.
    adaptive_batch: bool = False
    # A round at each arrival, job end and epoch end itself, not at the lease boundary
    # after it: the live loop's rounds come every second, so a job submitted to free
    # GPUs starts at once there. An idealisation for running jobs, which the live
    # cluster changes only at their own lease boundaries.
    event_rounds: bool = False
    # Every whole number of nodes' GPUs as a size too, besides the powers of two (the
    # live cluster runs any count in a job's elastic range, the Pollux artifact any
    # count): more placements to model, so a simulation takes longer.
    node_sizes: bool = False


@dataclass
class JobRecord:
    """One job's life in the simulation."""

    trace: TraceJob
    id: int
    submit: float
    model: JobModel
    alone_seconds: float  # its run time alone on a dedicated placement, full backprop
    least_gpu_seconds: float  # its GPU-seconds alone at its cheapest size: its useful work
    state: JobState = JobState.QUEUED
    preempted: bool = False
    gpus: tuple[int, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    progress: float = 0.0  # full-backprop-equivalent iterations done
    attained: float = 0.0
    held_since: float | None = None
    ready_at: float = 0.0  # setup after a (re)start ends then
    rate: float = 0.0  # full-backprop-equivalent iterations per second now
    first_start: float | None = None
    finish: float | None = None
    suspensions: int = 0
    reconfigurations: int = 0
    shared: bool = False  # shares a GPU with another job now
    packed_rounds: int = 0
    packings: int = 0  # times it was placed on GPUs another job held (as a guest)
    ran_spb: bool = False  # ran under an SPB configuration at some point
    noise: tuple[int, int] = (0, 0)  # of an adaptive job: (epoch, batch) of its model's noise
    batch: int = 0  # global batch it runs at now (0: its trace's)
    epoch_end: float = math.inf  # progress at which its model's epoch ends

    def epoch_end_time(self, now: float) -> float:
        """When an adaptive job enters its next epoch (and its model changes)."""
        left = self.epoch_end - self.progress
        return max(now, self.ready_at) + left / self.rate if self.rate > 0 else math.inf

    def finish_time(self, now: float) -> float:
        left = self.model.iterations_total - self.progress
        return max(now, self.ready_at) + left / self.rate if self.rate > 0 else math.inf


@dataclass
class Sample:
    time: float
    busy_gpus: int
    queued: int
    running: int


@dataclass
class SimResult:
    workload: str
    policy: str
    cluster: ClusterShape
    jobs: list[JobRecord]
    rejected: list[tuple[str, str]]  # (job name, why)
    samples: list[Sample]
    rounds: int
    conflicts: int  # plan entries the simulated store refused (illegal or over memory)
    busy_gpu_seconds: float
    packed_gpu_seconds: float = 0.0  # GPU-seconds with more than one job on the GPU


class Simulator:
    def __init__(
        self,
        jobs: list[TraceJob],
        cluster: ClusterShape,
        policy: Policy,
        *,
        workload: str = "workload",
        policy_name: str = "policy",
        options: SimOptions | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.options = options or SimOptions()
        self.workload = workload
        self.policy_name = policy_name
        self._on_progress = on_progress
        self._rejected: list[tuple[str, str]] = []
        self._records: list[JobRecord] = []
        for number, trace in enumerate(jobs, start=1):
            if trace.workers > cluster.gpus:
                self._rejected.append(
                    (trace.name, f"needs {trace.workers} GPUs; the cluster has {cluster.gpus}")
                )
                continue
            submit = 0.0 if self.options.zero_arrivals else trace.submit_seconds
            model = self._model(trace)
            alone, least = self._alone(trace, model)
            record = JobRecord(trace, number, submit, model, alone, least)
            if isinstance(trace.speed, MeasuredSpeed) and self._adapts(trace):
                app = trace.speed.application
                record.noise = (0, adaptive.noise_batch(app, trace.batch_size))
                record.epoch_end = app.epoch_progress(0)
            self._records.append(record)
        self._records.sort(key=lambda r: (r.submit, r.id))
        self._gpu_node = [g // cluster.gpus_per_node for g in range(cluster.gpus)]
        self._holders: list[list[int]] = [[] for _ in range(cluster.gpus)]
        self._gpu_views = [self._gpu_view(g) for g in range(cluster.gpus)]
        self._node_views = [self._node_view(n) for n in range(cluster.nodes)]
        self._dirty_nodes: set[int] = set()
        self._changed_gpus: set[int] = set()  # holders changed since speeds were set
        self._touched: set[int] = set()  # jobs reconfigured since speeds were set
        self._views: dict[int, JobView] = {}  # of jobs not running, until they change
        self._by_id = {record.id: record for record in self._records}
        self._interference = fitted().for_device(
            DEVICE_NAMES[self.options.gpu], self.options.sharing
        )
        self.conflicts = 0

    @property
    def models(self) -> tuple[JobModel, ...]:
        """The speed models of the jobs it runs (not those rejected)."""
        return tuple(record.model for record in self._records)

    # -- the job's speed ---------------------------------------------------------------

    def _adapts(self, trace: TraceJob) -> bool:
        return self.options.adaptive_batch and isinstance(trace.speed, MeasuredSpeed)

    def _placements(self, trace: TraceJob) -> list[tuple[int, ...]]:
        """GPUs per node of the job at the size asked for and, where the trace measures
        scaling, at every power of two (with `node_sizes`, every whole number of nodes)
        up to the most GPUs measured and the cluster holds (the sizes a policy may
        resize the job to)."""
        per_node = self.cluster.gpus_per_node
        sizes = {trace.workers}
        if isinstance(trace.speed, MeasuredSpeed):
            most = min(self.cluster.gpus, trace.speed.most_workers)
            sizes.update(1 << k for k in range(most.bit_length()) if 1 << k <= most)
            if self.options.node_sizes:
                sizes.update(range(per_node, most + 1, per_node))
        placements = []
        for workers in sorted(sizes):
            fewest = math.ceil(workers / per_node)
            most = min(workers, self.cluster.nodes) if trace.speed.elastic else fewest
            placements += [_spread(workers, nodes, per_node) for nodes in range(fewest, most + 1)]
        return placements

    def _model(self, trace: TraceJob, noise: tuple[int, int] | None = None) -> JobModel:
        """Step times on the job's placements (of an adaptive job: per base step of
        progress, at the batch chosen for each given the gradient noise of `noise` =
        (epoch, batch it was measured at); by default the first epoch's at the batch
        the job asked for)."""
        batches: dict[int, dict[int, int]] = {}
        solo = measured_solo(self.options.gpu, trace.workload) if trace.batch_size else None
        if self._adapts(trace):
            assert isinstance(trace.speed, MeasuredSpeed)
            app = trace.speed.application
            epoch, measured_at = noise or (0, adaptive.noise_batch(app, trace.batch_size))
            steps, batches = adaptive.table(app, epoch, measured_at, self._placements(trace))
            iterations = app.target_progress
        else:
            steps = {}
            for placement in self._placements(trace):
                step, sync = trace.speed.step_time(placement)
                if solo is not None:  # measured compute there, the profile's network
                    step = solo.at(trace.batch_size / sum(placement)).step_seconds + sync
                steps.setdefault(sum(placement), {})[len(placement)] = (step, sync)
            iterations = trace.iterations
        profile = profile_for(trace.workload, self.options.spb_profiles)
        # Memory at the per-GPU batch of the size it asked for: shrunk, a job is taken to
        # accumulate gradients over micro-batches no larger than that.
        micro = trace.micro_batch_at(trace.workers) or profile.per_worker_batch
        memory, activation_share = memory_per_gpu(profile, micro)
        # Solo utilization at the size asked for: busy while computing, at the measured
        # utilization where measured, else saturated (`scheduler.sim.gpus`).
        step, sync = steps[trace.workers][min(steps[trace.workers])]
        busy = 1.0
        if solo is not None:
            measured = solo.at(trace.batch_size / trace.workers)
            memory, busy = measured.memory_bytes, measured.utilization
        utilization = busy * (step - min(sync, step)) / step if step > 0 else busy
        return JobModel(
            iterations_total=math.ceil(iterations),
            workers=trace.workers,
            steps=steps,
            memory_bytes=memory,
            activation_fraction=activation_share,
            spb_profile=profile,
            utilization=utilization,
            batches=batches,
        )

    def _alone(self, trace: TraceJob, model: JobModel) -> tuple[float, float]:
        """The job's run time alone on the GPUs it asked for, and its GPU-seconds
        alone at its cheapest size (both on the fewest nodes, full backprop; an
        adaptive job's epoch by epoch, at each epoch's best batch)."""
        per_node = self.cluster.gpus_per_node
        fewest = {w: _spread(w, math.ceil(w / per_node), per_node) for w in model.sizes}
        if not (self._adapts(trace) and isinstance(trace.speed, MeasuredSpeed)):
            step = {w: model.step_at(w, len(p))[0] for w, p in fewest.items()}
            total = model.iterations_total
            return total * step[model.workers], total * min(w * t for w, t in step.items())
        app = trace.speed.application
        measured_at = adaptive.noise_batch(app, trace.batch_size)
        alone = least = 0.0
        for epoch, work in adaptive.epochs_ahead(app, 0.0):
            step = {}
            for w, placement in fewest.items():
                found = adaptive.size_step(app, epoch, measured_at, placement)
                if found is not None:
                    step[w] = found[0]
            alone += work * step[model.workers]
            least += work * min(w * t for w, t in step.items())
        return alone, least

    def _shape(self, record: JobRecord) -> Shape:
        nodes = len({self._gpu_node[g] for g in record.gpus})
        return record.model.shape(spb.resolve(record.config), len(record.gpus), nodes)

    # -- views -----------------------------------------------------------------------

    def _gpu_view(self, gpu: int) -> GPUView:
        node = gpu // self.cluster.gpus_per_node
        return GPUView(
            id=gpu,
            node_id=node,
            node_name=f"node-{node:04d}",
            index=gpu % self.cluster.gpus_per_node,
            kind=DEVICE_NAMES[self.options.gpu],
            memory_bytes=self.cluster.gpu_memory_bytes,
            holders=tuple(self._holders[gpu]),
            max_jobs=self.options.max_jobs_per_gpu,
        )

    def _node_view(self, node: int) -> NodeView:
        per_node = self.cluster.gpus_per_node
        return NodeView(
            id=node,
            name=f"node-{node:04d}",
            alive=True,
            gpus=tuple(self._gpu_views[node * per_node : (node + 1) * per_node]),
        )

    def _job_view(self, record: JobRecord) -> JobView:
        """The policy's view of a job; a waiting job's does not change while it waits."""
        if record.state is not JobState.RUNNING:
            view = self._views.get(record.id)
            if view is not None and view.state is record.state:
                return view
        view = JobView(
            id=record.id,
            state=record.state,
            priority=record.trace.priority,
            workers=record.trace.workers,
            created_at=EPOCH + timedelta(seconds=record.submit),
            queue=record.trace.queue,
            allocated_gpu_ids=record.gpus,
            iterations_done=int(record.progress),
            spb=record.config,
            attained_gpu_seconds=record.attained,
            restarts=record.suspensions,
            held_since=None
            if record.held_since is None
            else EPOCH + timedelta(seconds=record.held_since),
            preempted=record.preempted,
            model=record.model,
            max_iterations=record.trace.iterations,
            resize_seconds=self.options.restart_seconds,  # a move is a restart here
            grow_seconds=self.options.grow_seconds,
        )
        if record.state is not JobState.RUNNING:
            self._views[record.id] = view
        return view

    def _set_holders(self, record: JobRecord, add: bool) -> None:
        for gpu in record.gpus:
            if add:
                self._holders[gpu].append(record.id)
            else:
                self._holders[gpu].remove(record.id)
            self._gpu_views[gpu] = replace(self._gpu_views[gpu], holders=tuple(self._holders[gpu]))
            self._dirty_nodes.add(self._gpu_node[gpu])
            self._changed_gpus.add(gpu)

    # -- the run ---------------------------------------------------------------------

    def run(self) -> SimResult:
        step = self.options.round_seconds
        arrivals = 0  # records[:arrivals] have been submitted
        active: dict[int, JobRecord] = {}
        running: dict[int, JobRecord] = {}
        samples: list[Sample] = []
        finished = 0
        rounds = 0
        busy_seconds = 0.0
        packed_seconds = 0.0
        now = 0.0
        total = len(self._records)
        while finished < total:
            # 1. the next round: a lease boundary at or after the next event
            waiting = any(r.state is not JobState.RUNNING for r in active.values())
            events = [r.finish_time(now) for r in running.values()]
            events += [r.epoch_end_time(now) for r in running.values() if r.epoch_end < math.inf]
            if arrivals < total:
                events.append(self._records[arrivals].submit)
            if waiting and rounds:
                events.append(now + step)
            upcoming = min(events)
            following = max(math.ceil(upcoming / step) * step, now + step if rounds else 0.0)
            if self.options.event_rounds and upcoming > now:
                following = upcoming
            # 2. progress and ends until then
            busy_until: dict[int, float] = {}
            packed_seconds += self._shared_seconds(running, now, following)
            for record in list(running.values()):
                end = record.finish_time(now)
                for gpu in record.gpus:
                    busy_until[gpu] = max(busy_until.get(gpu, now), min(end, following))
                until = min(end, following)
                start = max(now, record.ready_at)
                if until > start:
                    record.progress += (until - start) * record.rate
                record.attained += len(record.gpus) * (min(end, following) - now)
                if end <= following:
                    record.progress = record.model.iterations_total
                    record.finish = end
                    record.state = JobState.SUCCEEDED
                    self._set_holders(record, add=False)
                    del running[record.id]
                    del active[record.id]
                    finished += 1
            busy_seconds += sum(busy_until.values()) - now * len(busy_until)
            now = following
            self._next_epochs(running)
            while arrivals < total and self._records[arrivals].submit <= now:
                record = self._records[arrivals]
                active[record.id] = record
                arrivals += 1
            # 3. snapshot, policy, plan
            rounds += 1
            for node in self._dirty_nodes:
                self._node_views[node] = self._node_view(node)
            self._dirty_nodes.clear()
            newest = self._records[arrivals - 1].submit if arrivals else None
            snapshot = ClusterSnapshot(
                nodes=tuple(self._node_views),
                jobs=tuple(self._job_view(r) for r in active.values()),
                now=EPOCH + timedelta(seconds=now),
                last_submitted_at=None if newest is None else EPOCH + timedelta(seconds=newest),
            )
            plan = self.policy(snapshot)
            self._apply(plan, snapshot, now, running)
            if not running and arrivals == total and active:
                raise SimulationStuck(
                    f"{self.policy_name} runs none of the {len(active)} waiting job(s) on an "
                    "idle cluster with nothing left to arrive"
                )
            self._set_speeds(running)
            samples.append(
                Sample(
                    now,
                    sum(1 for holders in self._holders if holders),
                    len(active) - len(running),
                    len(running),
                )
            )
            if self._on_progress is not None:
                self._on_progress(finished, total)
        return SimResult(
            workload=self.workload,
            policy=self.policy_name,
            cluster=self.cluster,
            jobs=self._records,
            rejected=self._rejected,
            samples=samples,
            rounds=rounds,
            conflicts=self.conflicts,
            busy_gpu_seconds=busy_seconds,
            packed_gpu_seconds=packed_seconds,
        )

    def _next_epochs(self, running: dict[int, JobRecord]) -> None:
        """Adaptive jobs that entered a new epoch, or whose batch moved to another
        validated size, get the model of the noise they now measure (and its speed)."""
        for record in running.values():
            speed = record.trace.speed
            if not (self._adapts(record.trace) and isinstance(speed, MeasuredSpeed)):
                continue
            app = speed.application
            noise = (
                app.epoch_at(record.progress),
                adaptive.noise_batch(app, record.batch or record.trace.batch_size),
            )
            if noise != record.noise:
                record.noise = noise
                record.epoch_end = app.epoch_progress(noise[0])
                record.model = self._model(record.trace, noise)
                self._touched.add(record.id)

    def _shared_seconds(self, running: dict[int, JobRecord], now: float, until: float) -> float:
        """GPU-seconds from `now` to `until` with more than one running job on the GPU."""
        total = 0.0
        for holders in self._holders:
            if len(holders) > 1:
                ends = sorted(min(running[j].finish_time(now), until) for j in holders)
                total += max(ends[-2] - now, 0.0)  # shared until all but one have left
        return total

    def _apply(
        self, plan: Plan, snapshot: ClusterSnapshot, now: float, running: dict[int, JobRecord]
    ) -> None:
        """The loop's order (suspend and stop, reconfigure, start), of the items the
        loop's validator accepts; each refused one counts as a conflict."""
        checked = validate(plan, snapshot)
        self.conflicts += len(checked.rejected)
        plan = checked.plan
        # Resizes run on the live cluster only so far: counted, not silently dropped.
        self.conflicts += len(plan.resize)
        held = {job_id: self._by_id[job_id].gpus for job_id in plan.suspend}
        for job_id in plan.suspend:
            record = self._by_id[job_id]
            self._end(record, now, running)
            record.state = JobState.SUSPENDED
            record.preempted = True
            record.suspensions += 1
        for job_id in plan.stop:
            record = self._by_id[job_id]
            if record.state is JobState.RUNNING:
                self._end(record, now, running)
            record.state = JobState.FAILED
        for change in plan.reconfigure:
            record = self._by_id[change.job_id]
            if record.config != change.spb:
                record.config = dict(change.spb)
                record.reconfigurations += 1
                record.ran_spb = record.ran_spb or spb.resolve(change.spb) is not None
                self._touched.add(record.id)
        for placement in plan.start:
            record = self._by_id[placement.job_id]
            self._views.pop(record.id, None)
            if any(self._holders[g] for g in placement.gpu_ids):
                record.packings += 1
            record.state = JobState.RUNNING  # SCHEDULED, then acknowledged at once
            record.preempted = False
            record.gpus = tuple(placement.gpu_ids)
            record.config = dict(placement.spb)
            record.ran_spb = record.ran_spb or spb.resolve(placement.spb) is not None
            record.held_since = now
            setup = self.options.restart_seconds
            if self.options.grow_seconds is not None and self._in_place(
                held.get(record.id, ()), record.gpus
            ):
                setup = self.options.grow_seconds
            record.ready_at = now + setup
            if record.first_start is None:
                record.first_start = now
            self._set_holders(record, add=True)
            running[record.id] = record

    def _in_place(self, before: tuple[int, ...], after: tuple[int, ...]) -> bool:
        """Whether a move from GPUs `before` to `after` is a growth the cluster does in
        place (`scheduler.resize.in_place`)."""
        return (
            bool(before)
            and set(before) < set(after)
            and before[0] == after[0]
            and len({self._gpu_node[gpu] for gpu in after}) == 1
        )

    def _end(self, record: JobRecord, now: float, running: dict[int, JobRecord]) -> None:
        self._set_holders(record, add=False)
        record.gpus = ()
        record.config = {}
        record.held_since = None
        record.rate = 0.0
        running.pop(record.id, None)

    def _set_speeds(self, running: dict[int, JobRecord]) -> None:
        """Speeds of the jobs whose GPUs or configuration changed this round (the rest
        train on as they did)."""
        changed, self._changed_gpus = self._changed_gpus, set()
        touched, self._touched = self._touched, set()
        for record in running.values():
            if record.id not in touched and not any(g in changed for g in record.gpus):
                continue
            shape = self._shape(record)
            stretch = [
                colocation_stretch(
                    [(j, self._utilization(j, gpu)) for j in self._holders[gpu]],
                    self._interference,
                )[record.id]
                for gpu in record.gpus
            ]
            record.shared = any(len(self._holders[g]) > 1 for g in record.gpus)
            record.rate = 1.0 / (stretched_step(shape, stretch) * shape.steps_ratio)
            nodes = len({self._gpu_node[g] for g in record.gpus})
            record.batch = record.model.batch_at(len(record.gpus), nodes)
        for record in running.values():
            if record.shared:
                record.packed_rounds += 1

    def _utilization(self, job_id: int, gpu: int) -> float | None:
        record = self._by_id[job_id]
        utilizations = self._shape(record).utilizations
        return None if utilizations is None else utilizations[record.gpus.index(gpu)]


def _spread(workers: int, nodes: int, per_node: int) -> tuple[int, ...]:
    """GPUs per node of a job on `nodes` nodes: as full as possible on the fewest,
    evenly when spread wider."""
    fewest = math.ceil(workers / per_node)
    if nodes <= fewest:
        full, rest = divmod(workers, per_node)
        return (per_node,) * full + ((rest,) if rest else ())
    base, extra = divmod(workers, nodes)
    return tuple(base + (1 if i < extra else 0) for i in range(nodes))
