"""Runs and supervises the training processes of this node's jobs.

One worker process per rank (`pool`), each writing its output to the rank's log, which
is also forwarded line by line. The supervisor tells rank 0 what the scheduler last said
about the job (at its first check, then at every change: `channel`), and turns reports,
evaluations, output lines and process exits into events on `outbound`
(`jobs.JobEvent`: one `JobEnded` per job, last), which `wire` makes messages for the
scheduler. It knows neither gRPC nor the protocol's messages.

A job whose every rank runs here may be resized in place (`resize_in_place`): at its next
boundary each rank checkpoints and says "shrunk"; the ranks on the new gang's GPUs are
given their configuration in it (renumbered, the same GPU) and train on in the same
processes, the others exit (`Outcome.LEFT`); `Shrunk` tells the scheduler once they
have, so that their GPUs go to other jobs only when free. A resize to more GPUs of this
node grows the job so: once every rank has checkpointed, the new GPUs' ranks (joiners)
start and resume from that checkpoint, as a restart's ranks do, while the others wait
for them at the new gang's rendezvous. A "shrink" to all of its GPUs changes an
adaptive job's global batch in place (a rebatch): nobody leaves.

A job never has two runs here, and a launch older than an attempt seen here never
starts: the attempt is the run's fence (the scheduler's placement number), also written
into each worker's configuration so that a stale worker writes no checkpoint.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from jigsaw.gpus import GpuSlot
from worker_agent.channel import RankLink, WorkerChannel
from worker_agent.isolation import WorkerIdentity, give_to, unreachable
from worker_agent.jobs import (
    Evaluated,
    Iterations,
    JobEnded,
    JobEvent,
    JobLaunch,
    LogLine,
    NodeResources,
    Profiled,
    RunHere,
    Shrunk,
)
from worker_agent.pool import (
    JOB_DIR_MODE_SHARED,
    PRIVATE_DIR_MODE,
    ProcessPool,
    prepare_worker_user,
    reap,
    signal_group,
    unreachable_message,
    wait_unreaped,
)
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.protocol import EXIT_CODES, Action, Decision, IterationRecord, Outcome

logger = logging.getLogger(__name__)

_PRIVATE_FILE_MODE = 0o600
_ERROR_TAIL_CHARS = 4000
_MAX_LOG_LINE_CHARS = 8192
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
# A worker sends its exit message right before exiting; after the process is gone, its
# connection may still wait in the Listener's backlog or hold that unread last message.
_CONNECT_GRACE_SECONDS = 1.0
_DISCONNECT_GRACE_SECONDS = 10.0

_OUTCOME_OF_CODE = {code: outcome for outcome, code in EXIT_CODES.items()}


class LaunchError(ValueError):
    """A launch this node cannot carry out; the job's exit says why."""


class NoRoom(LaunchError):
    """A launch that would exceed a GPU slot's memory or jobs: refused, not failed (the
    scheduler queues the job again)."""


@dataclass(eq=False)
class _Rank:
    rank: int  # now (an in-place resize renumbers the ranks that stay)
    process: subprocess.Popen[bytes]
    log_path: Path
    gpu_index: int
    link: RankLink
    reaped: bool = False  # from then on its pid (and process group id) may be reused
    returncode: int | None = None  # set once reaped and its output and messages are in
    exit_iteration: int | None = None  # from its exit message
    exit_error: str | None = None


@dataclass(eq=False)
class _Job:
    job_id: int
    attempt: int  # the launch's fence: its exit carries it back
    iteration: int  # the last boundary reported
    config_version: int
    config: dict[str, Any]
    memory_bytes: int  # each rank's cap on its GPU
    world_size: int  # of the whole gang, on every node
    checkpointed: bool  # the launch has a checkpoint directory
    # The rendezvous port of each group the run formed here, the current one last.
    ports: list[int] = field(default_factory=list)
    ranks: dict[int, _Rank] = field(default_factory=dict)  # the run's, by rank now
    # Every process the run started, in the order it was started: those an in-place
    # shrink dropped stay here (not in `ranks`) until they have exited.
    started: dict[int, _Rank] = field(default_factory=dict)
    # An in-place resize under way: each rank's configuration in the new gang (None: it
    # leaves), by rank now, and the ranks that have been answered; then the joiners'
    # (a growth's new ranks, by GPU index), started once every rank has been answered.
    shrink: dict[int, WorkerConfig | None] | None = None
    shrunk: dict[int, int] = field(default_factory=dict)  # rank now -> rank after
    joiners: dict[int, WorkerConfig] = field(default_factory=dict)
    resumed: bool = False  # its rank 0 goes on after a shrink and has not reported yet
    # A shrink all ranks were answered for, told once the ranks that left have exited
    # (the scheduler gives their GPUs to other jobs then).
    announce: Shrunk | None = None
    action: Action = Action.CONTINUE
    stop_requested: bool = False
    failure: str | None = None  # why the agent failed the job itself
    metrics: dict[str, float] = field(default_factory=dict)


class Supervisor:
    def __init__(
        self,
        slots: list[GpuSlot],
        work_dir: Path,
        *,
        torch_threads: int = 1,
        stop_grace_seconds: float = 10.0,
        warm_workers: int = 0,
        worker_user: str | None = None,
        worker_env: Sequence[str] = (),
        max_jobs_per_gpu: int = 4,
        mps_pipe_directory: Path | None = None,
    ) -> None:
        """`worker_user`: whom workers run as when this process is root (None: as this
        process); `worker_env`: variables they get beyond the allow-list;
        `max_jobs_per_gpu`: jobs that may share a slot (1: exclusive);
        `mps_pipe_directory`: the MPS daemon's, which CUDA workers then join. Raises
        IsolationError when that user could not run a worker here."""
        self.outbound: queue.Queue[JobEvent] = queue.Queue()
        self.node = NodeResources(
            {slot.index: slot for slot in slots}, work_dir / "data", torch_threads
        )
        self._work_dir = work_dir
        self._identity = prepare_worker_user(worker_user, work_dir, worker_env)
        self._stop_grace_seconds = stop_grace_seconds
        self._max_jobs_per_gpu = max_jobs_per_gpu
        # The most other jobs on a rank's GPU since its job's last report: (job, GPU index).
        self._co_runners: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[int, _Job] = {}
        # The newest attempt of each job launched here: an older launch never starts.
        self._attempts: dict[int, int] = {}
        self._closing = False
        self._channel = WorkerChannel()
        self._pool = ProcessPool(
            work_dir,
            self._identity,
            control_address=self._channel.address,
            authkey=self._channel.authkey,
            torch_threads=torch_threads,
            worker_env=worker_env,
            warm=warm_workers,
            mps_pipe_directory=mps_pipe_directory,
        )
        self._channel.serve(self, self._pool)

    @property
    def worker_identity(self) -> WorkerIdentity | None:
        """The user workers run as; None: this process's own."""
        return self._identity

    def job_dir(self, job_id: int) -> Path:
        """The job's private directory: its ranks' configurations, logs and code."""
        return self._work_dir / f"job-{job_id}"

    @property
    def control_address(self) -> str:
        return self._channel.address

    # ------------------------------------------------------------------ commands

    def launch(self, launch: JobLaunch) -> None:
        """Start this node's ranks of a job (a resume is a launch with start_iteration > 0).

        A rank shares its GPU slot with other jobs' ranks while the slot's jobs stay
        within `max_jobs_per_gpu` and their memory caps within its memory; a launch
        beyond either is refused with the reason (an exit REFUSED: the job queues
        again). A job never has two runs here: the launch of the attempt already running is
        ignored (a repeated command); one of a newer attempt means the scheduler gave up on
        the run here (its agent fell silent past the timeout, say), so that run is stopped
        and the launch refused until it is gone (REFUSED: the job queues again, through no
        fault of its own); one older than an attempt this agent has seen is a stale command,
        which must not start a second incarnation beside the job's current one. That, or a
        launch that cannot be carried out, ends its attempt at once with a FAILED exit that
        says why.
        """
        with self._lock:
            job_id, attempt = launch.job_id, launch.attempt
            running = self._jobs.get(job_id)
            if running is not None and running.attempt == attempt:
                logger.warning(
                    "job %d attempt %d already runs here: launch ignored",
                    job_id,
                    attempt,
                    extra={"job_id": job_id},
                )
                return
            newest = self._attempts.get(job_id, attempt)
            stale = running is not None and running.attempt < attempt
            if stale:
                self._attempts[job_id] = attempt
        if stale:
            assert running is not None
            reason = f"attempt {running.attempt} of this job still runs on this node"
            self.stop(job_id, f"{reason}; the scheduler launched attempt {attempt}")
            self.outbound.put(
                JobEnded(job_id, attempt, Outcome.REFUSED, error_tail=f"{reason}: stopping it")
            )
            return
        with self._lock:
            running = self._jobs.get(job_id)
            if running is not None or attempt < newest:
                self._fail_before_start(
                    job_id,
                    f"launch of attempt {attempt} refused: attempt "
                    f"{running.attempt if running is not None else newest} of this job "
                    f"{'runs' if running is not None else 'ran'} on this node",
                    attempt,
                )
                return
            self._attempts[job_id] = attempt
            try:
                if launch.problem is not None:
                    raise LaunchError(launch.problem)
                self._check_room(set(launch.gpus.values()), launch.memory_bytes)
                self._prepare_checkpoint_dir(launch.configs[0].checkpoint_dir)
            except NoRoom as exc:
                logger.warning("job %d: launch refused: %s", job_id, exc, extra={"job_id": job_id})
                self.outbound.put(JobEnded(job_id, attempt, Outcome.REFUSED, error_tail=str(exc)))
                return
            except LaunchError as exc:
                self._fail_before_start(job_id, str(exc), attempt)
                return
            # Every rank starts from the launch's SPB configuration; reconfigurations
            # with newer versions follow at boundaries.
            first = launch.configs[0]
            job = _Job(
                job_id,
                attempt,
                launch.start_iteration,
                launch.config_version,
                dict(first.spb),
                launch.memory_bytes,
                world_size=first.world_size,
                checkpointed=first.checkpoint_dir is not None,
                ports=[first.master_port],
            )
            self._jobs[job.job_id] = job
            self._spawn(job, launch.configs, launch.gpus)

    def stop(self, job_id: int, reason: str = "") -> None:
        """End the job's processes: SIGTERM now, SIGKILL after the grace period."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                logger.info(
                    "stop of job %d, which does not run here: nothing to do",
                    job_id,
                    extra={"job_id": job_id},
                )
                return
            logger.info(
                "stopping job %d%s",
                job_id,
                f": {reason}" if reason else "",
                extra={"job_id": job_id},
            )
            job.stop_requested = True
            job.action = Action.STOP
            self._terminate(job)
        self._tell_rank0(job)

    def suspend(self, job_id: int) -> None:
        """Rank 0 checkpoints at its next boundary; then every rank exits (code 3)."""
        with self._lock:
            job = self._running(job_id, "suspend")
            if job is None:
                return
            if job.action is not Action.CONTINUE:
                return
            job.action = Action.SUSPEND
        self._tell_rank0(job)

    def resize_in_place(self, launch: JobLaunch) -> None:
        """Resize the job in place at its next boundary to `launch`'s ranks: a launch of
        its running attempt on some of the GPUs its ranks hold, or all of them (at another
        batch, or with more GPUs of this node: a growth), rank 0 on rank 0's. A job that
        cannot be resized so (ranks on other nodes, another attempt, a command under way,
        no room on a new GPU) is suspended instead: its checkpoint lets the scheduler
        restart it on the new gang."""
        with self._lock:
            job = self._running(launch.job_id, "resize in place")
            if job is None:
                return
            why = _why_not_in_place(job, launch, self.node)
            if why is None:
                try:
                    held = {rank.gpu_index for rank in job.ranks.values()}
                    self._check_room(set(launch.gpus.values()) - held, launch.memory_bytes)
                except NoRoom as exc:
                    why = str(exc)
            if why is None:
                config_on = {launch.gpus[config.rank]: config for config in launch.configs}
                job.shrink = {}
                for number, rank in job.ranks.items():
                    config = config_on.pop(rank.gpu_index, None)
                    job.shrink[number] = (
                        None  # a GPU the job holds: it counts there
                        if config is None
                        else self._threaded(
                            config, rank.gpu_index, len(self._on_gpu(rank.gpu_index))
                        )
                    )
                job.joiners = config_on
                job.shrunk = {}
                job.action = Action.SHRINK
                job.ports.append(launch.configs[0].master_port)
            elif job.action is Action.CONTINUE:
                job.action = Action.SUSPEND
        if why is None:
            logger.info(
                "job %d: resizing in place to ranks on GPUs %s",
                job.job_id,
                sorted(launch.gpus.values()),
                extra={"job_id": job.job_id},
            )
        else:
            logger.warning(
                "job %d: cannot resize in place (%s): suspending it",
                job.job_id,
                why,
                extra={"job_id": job.job_id},
            )
        self._tell_rank0(job)

    def reconfigure(self, job_id: int, config_version: int, config: dict[str, Any]) -> None:
        """Rank 0 takes this configuration at its next boundary."""
        with self._lock:
            job = self._running(job_id, "reconfigure")
            if job is None:
                return
            if config_version <= job.config_version:
                logger.warning(
                    "job %d: configuration version %d is not newer than %d: ignored",
                    job_id,
                    config_version,
                    job.config_version,
                )
                return
            job.config_version, job.config = config_version, dict(config)
        self._tell_rank0(job)

    def cap(self, job_id: int, memory_bytes: int) -> None:
        """Each of the job's ranks here may use `memory_bytes` from now on (counted at
        once against its GPU), enforced by every rank from its next boundary; a cap not
        below the job's current one is ignored."""
        with self._lock:
            job = self._running(job_id, "cap")
            if job is None:
                return
            current = min(self._cap(job.memory_bytes, r.gpu_index) for r in job.ranks.values())
            if not 0 < memory_bytes < current:
                logger.warning(
                    "job %d: memory cap %d is not below its %d: ignored",
                    job_id,
                    memory_bytes,
                    current,
                    extra={"job_id": job_id},
                )
                return
            job.memory_bytes = memory_bytes
        logger.info(
            "job %d: memory cap lowered to %s", job_id, _gib(memory_bytes), extra={"job_id": job_id}
        )
        self._tell_rank0(job)

    def _running(self, job_id: int, command: str) -> _Job | None:
        """The job a command is for, or None (said in the log) when it does not run
        here (lock held)."""
        job = self._jobs.get(job_id)
        if job is None:
            logger.warning(
                "%s of job %d, which does not run here: ignored",
                command,
                job_id,
                extra={"job_id": job_id},
            )
        return job

    def running(self) -> dict[int, dict[int, int]]:
        """The jobs with processes on this node: rank -> GPU index of each."""
        return {job_id: run.ranks for job_id, run in self.runs().items()}

    def runs(self) -> dict[int, RunHere]:
        """The jobs with processes on this node."""
        with self._lock:
            return {
                job_id: RunHere(
                    job.attempt,
                    {r: rank.gpu_index for r, rank in sorted(job.ranks.items())},
                    list(job.ports),
                )
                for job_id, job in self._jobs.items()
            }

    def pids(self, job_id: int) -> dict[int, int]:
        """Rank -> process id of the job's workers here (for diagnostics and tests)."""
        with self._lock:
            job = self._jobs.get(job_id)
            return {r: rank.process.pid for r, rank in job.ranks.items()} if job else {}

    def idle_pids(self) -> list[int]:
        """Process ids of the pooled workers ready to take a rank (for tests)."""
        return self._pool.idle_pids()

    def close(self) -> None:
        """Stop every job and the warm pool, wait for their processes, and stop listening.

        Closing again does nothing.
        """
        if self._closing:
            return
        self._pool.close()
        for job_id in self.running():
            self.stop(job_id, "the agent is shutting down")
        with self._changed:
            if not self._changed.wait_for(
                lambda: not self._jobs, timeout=self._stop_grace_seconds + 30
            ):
                logger.error("processes of jobs %s did not end", sorted(self._jobs))
        self._pool.join(timeout=30)
        self._closing = True
        self._channel.close()

    # ------------------------------------------------------------------ the channel's

    def link(self, job_id: int, rank: int, pid: int) -> RankLink | None:
        """The link of a worker saying hello, if it is one of ours (`channel.Ranks`)."""
        with self._lock:
            job = self._jobs.get(job_id)
            found = job.ranks.get(rank) if job is not None else None
            return found.link if found is not None and found.process.pid == pid else None

    # ------------------------------------------------------------------ launching

    def _on_gpu(self, index: int) -> list[_Job]:
        """The jobs with a process on GPU `index` (lock held): a rank a shrink dropped
        holds it until it has exited."""
        return [
            job
            for job in self._jobs.values()
            if any(
                rank.gpu_index == index and (job.ranks.get(rank.rank) is rank or not rank.reaped)
                for rank in job.started.values()
            )
        ]

    def _cap(self, memory_bytes: int, index: int) -> int:
        """A rank's memory on GPU `index`: its cap, or the whole slot without one."""
        return memory_bytes or self.node.slots[index].memory_bytes

    def _check_room(self, indices: set[int], memory_bytes: int) -> None:
        """NoRoom when one of these GPUs would hold more jobs than allowed, or more
        memory than it has, with the jobs already on it, were a job capped at
        `memory_bytes` placed there (lock held)."""
        for index in sorted(indices):
            slot = self.node.slots[index]
            there = self._on_gpu(index)
            if len(there) + 1 > self._max_jobs_per_gpu:
                raise NoRoom(
                    f"GPU {index} already holds {len(there)} job(s) "
                    f"({sorted(job.job_id for job in there)}), the most it takes "
                    f"(JIGSAW_AGENT_MAX_JOBS_PER_GPU={self._max_jobs_per_gpu})"
                )
            held = sum(self._cap(job.memory_bytes, index) for job in there)
            wanted = self._cap(memory_bytes, index)
            if there and held + wanted > slot.memory_bytes:
                raise NoRoom(
                    f"GPU {index} has {_gib(slot.memory_bytes - held)} of its "
                    f"{_gib(slot.memory_bytes)} free beside jobs "
                    f"{sorted(job.job_id for job in there)}; this job's cap is {_gib(wanted)}"
                )

    def _shared(self, config: WorkerConfig, index: int) -> WorkerConfig:
        """A rank's configuration on a GPU it shares: a virtual slot's threads are split
        among its jobs, this one included (lock held, before the job's ranks exist)."""
        jobs = len(self._on_gpu(index)) + 1
        peak = jobs - 1
        for job in self._on_gpu(index):
            key = (job.job_id, index)
            self._co_runners[key] = max(self._co_runners.get(key, 0), peak)
        self._co_runners[(config.job_id, index)] = peak
        return self._threaded(config, index, jobs)

    def _threaded(self, config: WorkerConfig, index: int, jobs: int) -> WorkerConfig:
        """The rank's configuration with its share of a virtual slot's threads among
        `jobs` jobs there."""
        if not self.node.slots[index].virtual or jobs == 1:
            return config
        return config.model_copy(update={"torch_threads": max(1, self.node.torch_threads // jobs)})

    def _co_runners_since_report(self, job_id: int, index: int) -> int:
        """The most other jobs on GPU `index` since the job's previous report; the window
        starts again now (lock held)."""
        # A neighbour whose process there has exited no longer shares it, though its job
        # ends only once its output and messages are in.
        now = len(
            [
                job
                for job in self._on_gpu(index)
                if job.job_id != job_id
                and any(r.gpu_index == index and not r.reaped for r in job.ranks.values())
            ]
        )
        peak = max(self._co_runners.get((job_id, index), 0), now)
        self._co_runners[(job_id, index)] = now
        return peak

    def _prepare_checkpoint_dir(self, directory: Path | None) -> None:
        """A worker of another user writes the job's checkpoints: the directory is its."""
        if self._identity is None or directory is None:
            return
        blocked = unreachable(directory, self._identity)
        if blocked is not None:
            raise LaunchError(unreachable_message(self._identity, directory, blocked))
        try:
            give_to(directory, self._identity)
        except OSError as exc:
            raise LaunchError(
                f"cannot give checkpoint directory {directory} to worker user "
                f"{self._identity.name}: {exc}"
            ) from exc

    def _spawn(
        self, job: _Job, configs: Sequence[WorkerConfig], gpu_of_rank: Mapping[int, int]
    ) -> None:
        """Start these ranks of the job, each with its share of its GPU (lock held)."""
        directory = self.job_dir(job.job_id)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            if self._identity is not None:
                os.chmod(directory, JOB_DIR_MODE_SHARED)
            warm = []
            for config in configs:
                gpu_index = gpu_of_rank[config.rank]
                config = self._shared(config, gpu_index)
                started_as = len(job.started)
                config_path = directory / f"rank-{config.rank}.json"
                # Written for warm ranks too: what each rank ran with, for diagnostics.
                self._write_config(config_path, config)
                log_path = directory / f"rank-{config.rank}.log"
                # Its watcher, running since it was spawned, ends a warm rank.
                pooled = self._pool.take_idle(config, partial(self._ended, job, started_as))
                process = pooled if pooled is not None else self._pool.spawn(config_path)
                events = _RankEvents(
                    job,
                    started_as,
                    self._lock,
                    self.outbound,
                    self.node.slots[gpu_index].kind,
                    partial(self._co_runners_since_report, job.job_id, gpu_index),
                    self._join,
                )
                rank = _Rank(config.rank, process, log_path, gpu_index, RankLink(events))
                job.ranks[config.rank] = job.started[started_as] = rank
                self._thread(job, rank, self._forward_output)
                if pooled is None:
                    self._thread(job, rank, self._watch)
                else:
                    warm.append(config.rank)
            logger.info(
                "job %d: started ranks %s from iteration %d (warm: %s)",
                job.job_id,
                sorted(config.rank for config in configs),
                job.iteration,
                warm,
            )
        except OSError as exc:
            job.failure = f"could not start the job's processes: {exc}"
            logger.error("job %d: %s", job.job_id, job.failure, extra={"job_id": job.job_id})
            if not job.ranks:
                del self._jobs[job.job_id]
                self.outbound.put(_failed_exit(job.job_id, job.failure, job.attempt))
                return
            _signal_ranks(job, signal.SIGKILL)

    def _join(self, job: _Job) -> None:
        """Start the joiners of a growth in place, its other ranks answered: each
        resumes from the boundary's checkpoint (lock held)."""
        gpu_of_rank = {config.rank: index for index, config in job.joiners.items()}
        joiners = sorted(job.joiners.values(), key=lambda config: config.rank)
        job.joiners = {}
        self._spawn(job, joiners, gpu_of_rank)

    def _thread(self, job: _Job, rank: _Rank, target: Callable[[_Job, _Rank], None]) -> None:
        threading.Thread(
            target=target,
            args=(job, rank),
            name=f"jigsaw-job-{job.job_id}-rank-{rank.rank}-{target.__name__}",
            daemon=True,
        ).start()

    def _write_config(self, path: Path, config: WorkerConfig) -> None:
        """The rank's configuration, readable by its worker only (and by the agent)."""
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _PRIVATE_FILE_MODE
        )
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if self._identity is not None:
                os.fchown(fd, self._identity.uid, self._identity.gid)
            handle.write(config.model_dump_json(indent=2))

    def _fail_before_start(self, job_id: int, message: str, attempt: int) -> None:
        logger.error("job %d: launch refused: %s", job_id, message, extra={"job_id": job_id})
        self.outbound.put(_failed_exit(job_id, message, attempt))

    def _terminate(self, job: _Job) -> None:
        """SIGTERM to the job's ranks now, SIGKILL after the grace period (lock held)."""
        _signal_ranks(job, signal.SIGTERM)
        timer = threading.Timer(self._stop_grace_seconds, self._kill, args=(job,))
        timer.daemon = True
        timer.start()

    def _kill(self, job: _Job) -> None:
        with self._lock:
            _signal_ranks(job, signal.SIGKILL)

    def _tell_rank0(self, job: _Job) -> None:
        rank = job.ranks.get(0)
        if rank is not None:
            self._channel.tell(rank.link)

    # ------------------------------------------------------------------ per process

    def _forward_output(self, job: _Job, rank: _Rank) -> None:
        """Append the worker's stdout and stderr to its log file and forward each line."""
        assert rank.process.stdout is not None
        fd = os.open(
            rank.log_path,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
            _PRIVATE_FILE_MODE,
        )
        with rank.process.stdout as output, os.fdopen(fd, "ab") as log:
            for line in output:
                log.write(line)
                log.flush()
                text = line.decode(errors="replace").rstrip()
                if text:
                    level = _LEVEL.search(text)
                    self.outbound.put(
                        LogLine(
                            job.job_id,
                            rank.rank,
                            level.group(1) if level else "INFO",
                            text[:_MAX_LOG_LINE_CHARS],
                        )
                    )

    def _watch(self, job: _Job, rank: _Rank) -> None:
        """Wait for a cold worker to exit, then end its rank."""
        wait_unreaped(rank.process)
        self._ended(job, next(n for n, started in job.started.items() if started is rank))

    def _ended(self, job: _Job, started_as: int) -> None:
        """Reap the exited worker started as rank `started_as` and end the job after its
        last rank (one an in-place shrink dropped only frees its GPU)."""
        with self._lock:
            rank = job.started[started_as]
            returncode = reap(rank.process)
            rank.reaped = True
        if rank.link.connected.wait(_CONNECT_GRACE_SECONDS):
            rank.link.disconnected.wait(_DISCONNECT_GRACE_SECONDS)
        with self._changed:
            rank.returncode = returncode
            if job.ranks.get(rank.rank) is not rank:
                self._co_runners.pop((job.job_id, rank.gpu_index), None)
                _announce_when_left(job, self.outbound)
                if returncode != EXIT_CODES[Outcome.LEFT]:
                    logger.warning(
                        "job %d: the process of a rank it shrank without exited with code %s",
                        job.job_id,
                        returncode,
                        extra={"job_id": job.job_id},
                    )
                return
            failed = _outcome(returncode) is Outcome.FAILED
            if failed and job.failure is None and not job.stop_requested:
                # Its peers would wait for it at a collective or a rendezvous until
                # their timeout: the job has failed, so they go now.
                job.failure = _error_tail(rank)
                logger.error(
                    "job %d: rank %d failed (exit code %s): stopping its other ranks",
                    job.job_id,
                    rank.rank,
                    returncode,
                    extra={"job_id": job.job_id},
                )
                self._terminate(job)
            if all(other.returncode is not None for other in job.ranks.values()):
                del self._jobs[job.job_id]
                for other in job.started.values():
                    self._co_runners.pop((job.job_id, other.gpu_index), None)
                self.outbound.put(_job_exit(job))
                self._changed.notify_all()


@dataclass(eq=False)
class _RankEvents:
    """What one rank's worker tells, into its job and `outbound` (`channel.RankEvents`)."""

    job: _Job
    started_as: int  # its process's key in `_Job.started`
    lock: threading.Lock  # the supervisor's
    outbound: queue.Queue[JobEvent]
    device_kind: str  # of the rank's GPU slot
    co_runners: Callable[[], int]  # other jobs on its GPU since the last report (lock held)
    join: Callable[[_Job], None]  # starts a growth's joiners (lock held)

    @property
    def rank(self) -> int:
        """Its rank now (-1: an in-place shrink dropped it)."""
        return self.job.started[self.started_as].rank

    def decision(self) -> Decision:
        with self.lock:
            return Decision(
                self.job.action,
                self.job.config_version,
                self.job.config,
                memory_bytes=self.job.memory_bytes,
            )

    def reported(self, records: list[IterationRecord]) -> None:
        with self.lock:
            self.job.iteration = max(self.job.iteration, records[-1].iteration)
            others = self.co_runners()
            urgent = self.job.action is Action.SHRINK or self.job.resumed
            self.job.resumed = False
        # A device-wide utilization says nothing of this job while others ran beside it.
        stamped = tuple(
            replace(
                record,
                co_runners=others,
                utilization=record.utilization
                if record.utilization_per_process or not others
                else None,
            )
            for record in records
        )
        self.outbound.put(Iterations(self.job.job_id, stamped, urgent))

    def evaluated(self, iteration: int, metrics: dict[str, float]) -> None:
        if self.rank == 0:
            with self.lock:
                self.job.metrics = metrics
        self.outbound.put(Evaluated(self.job.job_id, iteration, metrics))

    def profiled(self, workload: str, profile: dict[str, Any]) -> None:
        self.outbound.put(Profiled(self.job.job_id, workload, self.device_kind, profile))

    def shrunk(self, iteration: int) -> WorkerConfig | None:
        """This rank's configuration after the job's in-place resize (None: it leaves);
        once every rank has been answered, the job's ranks are the new gang's: those
        that stay, then a growth's joiners, started now (the boundary's checkpoint is
        written)."""
        with self.lock:
            job = self.job
            if job.shrink is None or self.rank not in job.shrink:
                return None  # no shrink asked of it: nothing to go on in
            config = job.shrink[self.rank]
            job.shrunk[self.rank] = config.rank if config is not None else -1
            if config is not None and config.rank == 0:
                job.action = Action.CONTINUE  # the smaller gang's first check is rank 0's
                job.resumed = True
            if len(job.shrunk) < len(job.shrink):
                return config
            ranks = {}
            for number, rank in job.ranks.items():
                rank.rank = job.shrunk[number]
                if rank.rank >= 0:
                    ranks[rank.rank] = rank
            job.ranks, job.shrink = ranks, None
            job.iteration = max(job.iteration, iteration)
            if job.joiners:
                self.join(job)
            job.world_size = len(job.ranks)
            gpus = {number: rank.gpu_index for number, rank in sorted(job.ranks.items())}
            job.announce = Shrunk(job.job_id, job.attempt, iteration, gpus)
            _announce_when_left(job, self.outbound)
        return config

    def exited(self, iteration: int, error_tail: str | None) -> None:
        with self.lock:
            rank = self.job.started[self.started_as]
            rank.exit_iteration, rank.exit_error = iteration, error_tail
            self.job.iteration = max(self.job.iteration, iteration)


# ---------------------------------------------------------------------- helpers


def _announce_when_left(job: _Job, outbound: queue.Queue[JobEvent]) -> None:
    """Tell the job's shrink once the ranks it dropped have exited (lock held)."""
    if job.announce is not None and all(
        rank.returncode is not None for rank in job.started.values() if rank.rank < 0
    ):
        outbound.put(job.announce)
        job.announce = None


def _why_not_in_place(job: _Job, launch: JobLaunch, node: NodeResources) -> str | None:
    """Why the job cannot be resized in place to `launch`, or None (lock held)."""
    if launch.problem is not None:
        return launch.problem
    if launch.attempt != job.attempt:
        return f"attempt {launch.attempt} is not the running {job.attempt}"
    if job.action is not Action.CONTINUE:
        return f"it is told to {job.action.value} already"
    if job.shrink is not None:
        return "its previous shrink is under way"
    if len(job.ranks) != job.world_size:
        return "some of its ranks run on other nodes"
    if not job.checkpointed:
        return "it has no checkpoint directory"
    held = {rank.gpu_index for rank in job.ranks.values()}
    new = set(launch.gpus.values())
    if not new or launch.gpus.get(0) != job.ranks[0].gpu_index or not (new <= held or held < new):
        return (
            f"GPUs {sorted(new)} neither are some of its GPUs {sorted(held)} nor hold them "
            f"all, with rank 0 on GPU {job.ranks[0].gpu_index}"
        )
    missing = sorted(new - set(node.slots))
    if missing:
        return f"this node has no GPU {missing}"
    return None


def _signal_ranks(job: _Job, signum: signal.Signals) -> None:
    """Signal the process group of every rank not yet reaped (caller holds the lock)."""
    for rank in job.started.values():
        if not rank.reaped:
            signal_group(rank.process.pid, signum)


def _failed_exit(job_id: int, message: str, attempt: int) -> JobEnded:
    return JobEnded(job_id, attempt, Outcome.FAILED, error_tail=message)


def _outcome(returncode: int) -> Outcome:
    """Any code but the outcomes' own (a crash, a signal, argparse's 2) is a failure."""
    return _OUTCOME_OF_CODE.get(returncode, Outcome.FAILED)


def _job_exit(job: _Job) -> JobEnded:
    """One exit for all of a job's ranks on this node."""
    ranks = [job.ranks[rank] for rank in sorted(job.ranks)]
    codes = [rank.returncode if rank.returncode is not None else -1 for rank in ranks]
    exit_code = next((code for code in codes if code), 0)
    outcomes = [_outcome(code) for code in codes]
    failing = next((r for r, o in zip(ranks, outcomes, strict=True) if o is Outcome.FAILED), None)
    error_tail = ""
    if job.failure is not None:
        outcome, error_tail = Outcome.FAILED, job.failure
    elif job.stop_requested:
        outcome = Outcome.SUCCEEDED if set(outcomes) == {Outcome.SUCCEEDED} else Outcome.STOPPED
    elif failing is not None:
        outcome, error_tail = Outcome.FAILED, _error_tail(failing)
    elif len(set(outcomes)) == 1:
        outcome = outcomes[0]
    else:
        outcome = Outcome.FAILED
        error_tail = "ranks ended differently: " + ", ".join(
            f"rank {rank.rank} exit code {rank.returncode}" for rank in ranks
        )
    iterations = [rank.exit_iteration for rank in ranks if rank.exit_iteration is not None]
    logger.info(
        "job %d: %s (exit codes %s)", job.job_id, outcome.value, codes, extra={"job_id": job.job_id}
    )
    return JobEnded(
        job.job_id,
        job.attempt,
        outcome,
        exit_code=exit_code,
        iteration=max(iterations, default=job.iteration),
        error_tail=error_tail,
        metrics=job.metrics,
    )


def _error_tail(rank: _Rank) -> str:
    """The worker's own account of its failure, else the end of its log."""
    if rank.exit_error:
        return str(rank.exit_error)[-_ERROR_TAIL_CHARS:]
    try:
        with rank.log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - _ERROR_TAIL_CHARS))
            tail = log.read().decode(errors="replace")
    except OSError as exc:
        tail = f"(no log: {exc})"
    return f"rank {rank.rank} exited with code {rank.returncode}\n{tail}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
