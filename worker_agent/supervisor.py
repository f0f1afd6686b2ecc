"""Runs and supervises the training processes of this node's jobs. Knows nothing of gRPC.

One worker process per rank (`python -m worker_agent.runtime.worker`), each in its own
process group. The supervisor holds the `multiprocessing.connection` Listener the workers
dial (`runtime/protocol.py`): it tells rank 0 what the scheduler last said about the job
(at its first check, then at every change), and turns reports, evaluations, output lines
and process exits into messages on `outbound`, ready for the scheduler:

    agent_pb2.JobIterations | Evaluation | LogTail | JobExit (one per job, last)

Warm pool: with `warm_workers` > 0 the supervisor keeps that many worker processes
started with `--pool`, which import torch and the runtime and then wait idle on their
connection. A launch hands each rank to an idle one (sending it the rank's
configuration) while there are any, and starts the others cold; a background thread then
tops the pool up again. An assigned pooled process is a rank like any other: same log
file, process group, stop and exit handling. What it printed while idle (import
warnings) stays in its pipe and lands in its rank's log. One that dies while idle is
replaced; one that dies before it ever got idle counts as a failure, and failures in a
row slow the replacements down (a broken installation must not fork in a loop).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from jigsaw.gpus import GpuSlot
from jigsaw.jobspec import JobSpec, SPBConfig
from jigsaw.proto.v1 import agent_pb2
from worker_agent.isolation import (
    IsolationError,
    WorkerIdentity,
    check_runtime_runs,
    give_to,
    resolve_worker_identity,
    unreachable,
    worker_environment,
)
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.lifeline import AGENT_PID_ENV
from worker_agent.runtime.protocol import (
    EXIT_CODES,
    Action,
    Decision,
    Outcome,
    assign_message,
)

logger = logging.getLogger(__name__)

Outbound = (
    agent_pb2.JobIterations
    | agent_pb2.Evaluation
    | agent_pb2.LogTail
    | agent_pb2.JobExit
    | agent_pb2.ModelProfileReport
)

_AUTHKEY_ENV = "JIGSAW_WORKER_AUTHKEY"
# Logs and configurations in a job directory are the agent's; a worker of another user
# may only reach its own configuration by name (search, no listing, no writing).
_JOB_DIR_MODE_SHARED = 0o711
_PRIVATE_DIR_MODE = 0o700
_PRIVATE_FILE_MODE = 0o600
_ERROR_TAIL_CHARS = 4000
_MAX_LOG_LINE_CHARS = 8192
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
# A worker sends its exit message right before exiting; after the process is gone, its
# connection may still wait in the Listener's backlog or hold that unread last message.
_CONNECT_GRACE_SECONDS = 1.0
_DISCONNECT_GRACE_SECONDS = 10.0

_OUTCOME_OF_CODE = {code: outcome for outcome, code in EXIT_CODES.items()}
_PROTO_OUTCOME = {
    Outcome.SUCCEEDED: agent_pb2.OUTCOME_SUCCEEDED,
    Outcome.FAILED: agent_pb2.OUTCOME_FAILED,
    Outcome.SUSPENDED: agent_pb2.OUTCOME_SUSPENDED,
    Outcome.STOPPED: agent_pb2.OUTCOME_STOPPED,
}

_POOL_BACKOFF_MAX_SECONDS = 60.0
_IDLE_OUTPUT_TAIL_BYTES = 4000

_CAN_WAIT_UNREAPED = hasattr(os, "waitid")


class LaunchError(ValueError):
    """A launch command this node cannot carry out; the job's exit says why."""


@dataclass
class _Rank:
    rank: int
    process: subprocess.Popen[bytes]
    log_path: Path
    gpu_index: int
    reaped: bool = False  # from then on its pid (and process group id) may be reused
    returncode: int | None = None  # set once reaped and its output and messages are in
    exit_message: dict[str, Any] | None = None
    connected: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)
    # Rank 0's connection once it asked for its first decision: every change follows.
    watcher: Connection | None = None
    # Orders the decisions sent on `watcher` as the job's state changed.
    send_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Pooled:
    """A warm worker: idle until `assigned` names the job and rank it became."""

    process: subprocess.Popen[bytes]
    connection: Connection | None = None  # set once it said idle: it can take a rank
    assigned: tuple[_Job, _Rank] | None = None


@dataclass
class _Job:
    job_id: int
    attempt: int  # the launch's fence: its exit carries it back
    iteration: int  # the last boundary reported
    config_version: int
    config: dict[str, Any]
    ranks: dict[int, _Rank] = field(default_factory=dict)
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
    ) -> None:
        """`worker_user`: whom workers run as when this process is root (None: as this
        process); `worker_env`: variables they get beyond the allow-list. Raises
        IsolationError when that user could not run a worker here."""
        self.outbound: queue.Queue[Outbound] = queue.Queue()
        self._slots = {slot.index: slot for slot in slots}
        self._work_dir = work_dir
        self._worker_env = tuple(worker_env)
        self._identity = _prepare_worker_user(worker_user, work_dir, self._worker_env)
        self._torch_threads = torch_threads
        self._stop_grace_seconds = stop_grace_seconds
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[int, _Job] = {}
        # The newest attempt of each job launched here: an older launch never starts.
        self._attempts: dict[int, int] = {}
        self._authkey = secrets.token_hex(32)
        # Loopback only, and every connection must prove it knows the authkey (HMAC).
        self._listener = Listener(("127.0.0.1", 0), authkey=self._authkey.encode())
        self._closing = False
        # Workers ask for PR_SET_PDEATHSIG (`lifeline`), which fires when the *thread*
        # that forked them ends: every worker is forked by this one thread, which lives
        # as long as the supervisor.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="jigsaw-spawner")
        self._acceptor = threading.Thread(target=self._accept, name="jigsaw-accept", daemon=True)
        self._acceptor.start()
        self._warm_workers = warm_workers
        self._pool: list[_Pooled] = []  # unassigned pooled processes, starting or idle
        self._pool_closing = threading.Event()
        self._pool_failures = 0  # pooled processes in a row that died before idle
        self._refiller = threading.Thread(
            target=self._keep_pool, name="jigsaw-warm-pool", daemon=True
        )
        if warm_workers:
            self._refiller.start()

    @property
    def worker_identity(self) -> WorkerIdentity | None:
        """The user workers run as; None: this process's own."""
        return self._identity

    @property
    def control_address(self) -> str:
        host, port = self._listener.address
        return f"{host}:{port}"

    # ------------------------------------------------------------------ commands

    def launch(self, command: agent_pb2.LaunchCommand) -> None:
        """Start this node's ranks of a job (a resume is a launch with start_iteration > 0).

        A job never has two runs here: the launch of the attempt already running is
        ignored (a repeated command), and one of another attempt is refused, as is one
        older than an attempt this agent has seen (a stale command must not start a
        second incarnation beside the job's current one). A refused launch, or one that
        cannot be carried out, ends that attempt at once with a FAILED exit that says why.
        """
        with self._lock:
            job_id, attempt = command.job_id, command.attempt
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
                configs = self._worker_configs(command)
                self._prepare_checkpoint_dir(configs[0].checkpoint_dir)
            except LaunchError as exc:
                self._fail_before_start(job_id, str(exc), attempt)
                return
            # Every rank starts from the launch's SPB configuration; reconfigurations
            # with newer versions follow at boundaries.
            job = _Job(
                job_id,
                attempt,
                command.start_iteration,
                command.config_version,
                dict(configs[0].spb),
            )
            self._jobs[job.job_id] = job
            self._spawn(job, configs, {a.rank: a.gpu_index for a in command.ranks})

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
            _signal_ranks(job, signal.SIGTERM)
        self._tell_rank0(job)
        timer = threading.Timer(self._stop_grace_seconds, self._kill, args=(job,))
        timer.daemon = True
        timer.start()

    def suspend(self, job_id: int) -> None:
        """Rank 0 checkpoints at its next boundary; then every rank exits (code 3)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                logger.warning(
                    "suspend of job %d, which does not run here: ignored",
                    job_id,
                    extra={"job_id": job_id},
                )
                return
            if job.action is not Action.CONTINUE:
                return
            job.action = Action.SUSPEND
        self._tell_rank0(job)

    def reconfigure(self, job_id: int, config_version: int, config: dict[str, Any]) -> None:
        """Rank 0 takes this configuration at its next boundary."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                logger.warning(
                    "reconfigure of job %d, which does not run here: ignored",
                    job_id,
                    extra={"job_id": job_id},
                )
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

    def running(self) -> dict[int, dict[int, int]]:
        """The jobs with processes on this node: rank -> GPU index of each."""
        return {job_id: ranks for job_id, (_, ranks) in self.runs().items()}

    def runs(self) -> dict[int, tuple[int, dict[int, int]]]:
        """The jobs with processes on this node: the attempt and rank -> GPU index."""
        with self._lock:
            return {
                job_id: (job.attempt, {r: rank.gpu_index for r, rank in sorted(job.ranks.items())})
                for job_id, job in self._jobs.items()
            }

    def pids(self, job_id: int) -> dict[int, int]:
        """Rank -> process id of the job's workers here (for diagnostics and tests)."""
        with self._lock:
            job = self._jobs.get(job_id)
            return {r: rank.process.pid for r, rank in job.ranks.items()} if job else {}

    def idle_pids(self) -> list[int]:
        """Process ids of the pooled workers ready to take a rank (for tests)."""
        with self._lock:
            return [p.process.pid for p in self._pool if p.connection is not None]

    def close(self) -> None:
        """Stop every job and the warm pool, wait for their processes, and stop listening.

        Closing again does nothing.
        """
        if self._closing:
            return
        self._close_pool()
        for job_id in self.running():
            self.stop(job_id, "the agent is shutting down")
        with self._changed:
            if not self._changed.wait_for(
                lambda: not self._jobs and not self._pool, timeout=self._stop_grace_seconds + 30
            ):
                logger.error(
                    "processes of jobs %s or %d warm workers did not end",
                    sorted(self._jobs),
                    len(self._pool),
                )
        self._closing = True
        # Wake the accepting thread out of accept() with a connection of our own.
        Client(self._listener.address, authkey=self._authkey.encode()).close()
        self._acceptor.join(timeout=10)
        self._listener.close()
        self._spawner.shutdown()

    # ------------------------------------------------------------------ launching

    def _worker_configs(self, command: agent_pb2.LaunchCommand) -> list[WorkerConfig]:
        """Every rank's configuration, or a LaunchError before anything starts."""
        if not command.ranks:
            raise LaunchError("the launch assigns no ranks to this node")
        if not command.master_addr:
            raise LaunchError("the launch has no master_addr")
        try:
            spec = JobSpec.model_validate_json(command.spec_json)
        except ValidationError as exc:
            raise LaunchError(f"invalid spec_json: {exc}") from exc
        indices = [assignment.gpu_index for assignment in command.ranks]
        ranks = [assignment.rank for assignment in command.ranks]
        unknown = sorted(set(indices) - set(self._slots))
        if unknown:
            raise LaunchError(
                f"GPU index {unknown} not on this node, which has {sorted(self._slots)}"
            )
        if len(set(indices)) < len(indices) or len(set(ranks)) < len(ranks):
            raise LaunchError(f"ranks {ranks} on GPUs {indices}: a rank or GPU is repeated")
        busy = {
            rank.gpu_index: job.job_id for job in self._jobs.values() for rank in job.ranks.values()
        }
        taken = {index: busy[index] for index in indices if index in busy}
        if taken:
            raise LaunchError(f"GPUs busy with other jobs (GPU index: job id): {taken}")
        try:
            spb_launch = json_object(command.spb_json or "{}", "spb_json")
        except ValueError as exc:
            raise LaunchError(str(exc)) from exc
        spb_stages = spec.spb.stages if isinstance(spec.spb, SPBConfig) else None
        try:
            return [
                WorkerConfig(
                    job_id=command.job_id,
                    attempt=command.attempt,
                    workload=spec.workload,
                    hyperparameters=spec.hyperparameters,
                    rank=assignment.rank,
                    world_size=command.world_size,
                    master_addr=command.master_addr,
                    master_port=command.master_port,
                    device=self._slots[assignment.gpu_index].device,
                    # The spec has no seed; the job id is the same on every rank and resume.
                    seed=command.job_id,
                    max_iterations=spec.max_iterations,
                    target_metric=spec.target_metric,
                    backprop=spec.backprop,
                    ooo_first_k=spec.ooo_first_k,
                    pipeline=spec.pipeline,
                    checkpoint_dir=Path(command.checkpoint_dir) if command.checkpoint_dir else None,
                    checkpoint_every=command.checkpoint_every or None,
                    data_dir=self._work_dir / "data",
                    torch_threads=self._torch_threads,
                    spb_enabled=spec.spb != "off",
                    # A fresh SPB job measures its model for the scheduler's pricing.
                    profile=spec.spb != "off" and command.start_iteration == 0,
                    spb=spb_launch,
                    spb_stages=spb_stages,
                )
                for assignment in command.ranks
            ]
        except ValidationError as exc:
            raise LaunchError(f"invalid launch: {exc}") from exc

    def _prepare_checkpoint_dir(self, directory: Path | None) -> None:
        """A worker of another user writes the job's checkpoints: the directory is its."""
        if self._identity is None or directory is None:
            return
        blocked = unreachable(directory, self._identity)
        if blocked is not None:
            raise LaunchError(_unreachable_message(self._identity, directory, blocked))
        try:
            give_to(directory, self._identity)
        except OSError as exc:
            raise LaunchError(
                f"cannot give checkpoint directory {directory} to worker user "
                f"{self._identity.name}: {exc}"
            ) from exc

    def _spawn(self, job: _Job, configs: list[WorkerConfig], gpu_of_rank: dict[int, int]) -> None:
        directory = self._work_dir / f"job-{job.job_id}"
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=_PRIVATE_DIR_MODE)
            if self._identity is not None:
                os.chmod(directory, _JOB_DIR_MODE_SHARED)
            warm = []
            for config in configs:
                config_path = directory / f"rank-{config.rank}.json"
                # Written for warm ranks too: what each rank ran with, for diagnostics.
                self._write_config(config_path, config)
                log_path = directory / f"rank-{config.rank}.log"
                pooled = self._assign_idle(config)
                process = (
                    pooled.process
                    if pooled is not None
                    else self._spawner.submit(self._popen, config_path).result()
                )
                rank = _Rank(config.rank, process, log_path, gpu_of_rank[config.rank])
                job.ranks[config.rank] = rank
                targets: list[Any] = [self._forward_output]
                if pooled is not None:
                    # Its watcher, running since it was spawned, now ends the rank.
                    pooled.assigned = (job, rank)
                    warm.append(config.rank)
                else:
                    targets.append(self._watch)
                for target in targets:
                    threading.Thread(
                        target=target,
                        args=(job, rank),
                        name=f"jigsaw-job-{job.job_id}-rank-{rank.rank}-{target.__name__}",
                        daemon=True,
                    ).start()
            logger.info(
                "job %d: started ranks %s from iteration %d (warm: %s)",
                job.job_id,
                sorted(job.ranks),
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

    def _write_config(self, path: Path, config: WorkerConfig) -> None:
        """The rank's configuration, readable by its worker only (and by the agent)."""
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _PRIVATE_FILE_MODE
        )
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if self._identity is not None:
                os.fchown(fd, self._identity.uid, self._identity.gid)
            handle.write(config.model_dump_json(indent=2))

    def _popen(self, config_path: Path | None) -> subprocess.Popen[bytes]:
        """A worker for `config_path`, or a pooled one (`--pool`) when None."""
        # The working directory stays the agent's, so that a user trial `module:Class`
        # imports in the worker exactly as it would in the agent.
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker_agent.runtime.worker",
                *(["--config", str(config_path)] if config_path is not None else ["--pool"]),
                "--control",
                self.control_address,
                "--authkey-env",
                _AUTHKEY_ENV,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self._worker_env_for(),
            **_as_user(self._identity),
            # Its own process group: a stop signals the worker and whatever it started.
            # No preexec_fn: forking this multi-threaded process (gRPC's threads among
            # them) to run Python before exec can deadlock the child; the worker sets up
            # its own death signal instead (`lifeline`).
            start_new_session=True,
        )

    def _worker_env_for(self) -> dict[str, str]:
        """A worker's environment: the allow-listed part of ours, and what it needs."""
        env = _worker_env(self._identity, self._work_dir, self._worker_env)
        threads = str(self._torch_threads)
        env.update(
            {
                _AUTHKEY_ENV: self._authkey,  # the environment, never argv (ps shows argv)
                AGENT_PID_ENV: str(os.getpid()),  # the worker dies with this process
                "OMP_NUM_THREADS": threads,
                "MKL_NUM_THREADS": threads,
                "PYTHONUNBUFFERED": "1",  # output lines reach the log as they are written
            }
        )
        return env

    def _fail_before_start(self, job_id: int, message: str, attempt: int) -> None:
        logger.error("job %d: launch refused: %s", job_id, message, extra={"job_id": job_id})
        self.outbound.put(_failed_exit(job_id, message, attempt))

    def _kill(self, job: _Job) -> None:
        with self._lock:
            _signal_ranks(job, signal.SIGKILL)

    # ------------------------------------------------------------------ the warm pool

    def _assign_idle(self, config: WorkerConfig) -> _Pooled | None:
        """An idle pooled process now running `config`, or None (caller holds the lock)."""
        while True:
            pooled = next((p for p in self._pool if p.connection is not None), None)
            if pooled is None:
                return None
            self._pool.remove(pooled)
            self._changed.notify_all()  # the refiller tops the pool up
            assert pooled.connection is not None
            # Gone but not yet noticed by its watcher: it must not take the rank.
            if not _exited(pooled.process):
                try:
                    pooled.connection.send(assign_message(config.model_dump(mode="json")))
                    return pooled
                except OSError as exc:
                    logger.warning("warm worker %d unreachable: %s", pooled.process.pid, exc)
            # Back in the pool as not idle, so that its watcher reaps it as a pooled one.
            pooled.connection = None
            self._pool.append(pooled)
            _signal_group(pooled.process.pid, signal.SIGKILL)

    def _keep_pool(self) -> None:
        """Keep `warm_workers` pooled processes, starting or idle, until the pool closes."""
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: self._pool_closing.is_set() or len(self._pool) < self._warm_workers
                )
                failures = self._pool_failures
            if failures and self._pool_closing.wait(
                min(_POOL_BACKOFF_MAX_SECONDS, 2.0 ** (failures - 1))
            ):
                return
            if self._pool_closing.is_set():
                return
            try:
                process = self._spawner.submit(self._popen, None).result()
            except OSError as exc:
                logger.error("could not start a warm worker: %s", exc)
                with self._lock:
                    self._pool_failures += 1
                continue
            pooled = _Pooled(process)
            with self._lock:
                self._pool.append(pooled)
                if self._pool_closing.is_set():  # close() did not see it: kill it here
                    _signal_group(process.pid, signal.SIGKILL)
            threading.Thread(
                target=self._watch_pooled,
                args=(pooled,),
                name=f"jigsaw-warm-{process.pid}",
                daemon=True,
            ).start()

    def _watch_pooled(self, pooled: _Pooled) -> None:
        """Wait for a pooled process to exit: replace it while idle, else end its rank."""
        _wait_unreaped(pooled.process)
        with self._changed:
            if pooled.assigned is None:
                self._reap_unassigned(pooled)
                self._changed.notify_all()  # the refiller and close() wait on the pool
                return
            job, rank = pooled.assigned
        self._rank_ended(job, rank)

    def _reap_unassigned(self, pooled: _Pooled) -> None:
        """Reap a pooled process that died before taking a rank (caller holds the lock)."""
        process = pooled.process
        if _CAN_WAIT_UNREAPED:
            _signal_group(process.pid, signal.SIGKILL)
        returncode = process.wait()
        self._pool.remove(pooled)
        output = _drain(process)
        if self._pool_closing.is_set():
            return
        if pooled.connection is None:
            self._pool_failures += 1  # never got idle: maybe broken for good, slow down
        logger.warning(
            "warm worker %d exited with code %d while idle; replacing it. Its output:\n%s",
            process.pid,
            returncode,
            output,
        )

    def _idle(self, pid: int, connection: Connection) -> _Pooled | None:
        """Note that pooled process `pid` is ready for a rank on `connection`."""
        with self._lock:
            pooled = next((p for p in self._pool if p.process.pid == pid), None)
            if pooled is not None:
                pooled.connection = connection
                self._pool_failures = 0
                logger.info("warm worker %d idle, ready for a rank", pid)
            return pooled

    def _idle_connection_lost(self, pooled: _Pooled) -> None:
        """Its connection broke while idle: useless now, so it is killed and replaced."""
        with self._lock:
            if pooled.assigned is None:
                pooled.connection = None
                _signal_group(pooled.process.pid, signal.SIGKILL)

    def _close_pool(self) -> None:
        """No more pooled processes; the idle ones are killed (their watchers reap them)."""
        with self._changed:
            self._pool_closing.set()
            self._changed.notify_all()
            for pooled in self._pool:
                _signal_group(pooled.process.pid, signal.SIGKILL)
        if self._refiller.is_alive():
            self._refiller.join()

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
                        agent_pb2.LogTail(
                            job_id=job.job_id,
                            rank=rank.rank,
                            level=level.group(1) if level else "INFO",
                            message=text[:_MAX_LOG_LINE_CHARS],
                        )
                    )

    def _watch(self, job: _Job, rank: _Rank) -> None:
        """Wait for the worker to exit, reap it, and end the job after its last rank."""
        _wait_unreaped(rank.process)
        self._rank_ended(job, rank)

    def _rank_ended(self, job: _Job, rank: _Rank) -> None:
        """Reap the exited worker of `rank` and end the job after its last rank."""
        process = rank.process
        with self._lock:
            if _CAN_WAIT_UNREAPED:
                _signal_group(process.pid, signal.SIGKILL)
            returncode = process.wait()
            rank.reaped = True
        if rank.connected.wait(_CONNECT_GRACE_SECONDS):
            rank.disconnected.wait(_DISCONNECT_GRACE_SECONDS)
        with self._changed:
            rank.returncode = returncode
            if all(other.returncode is not None for other in job.ranks.values()):
                del self._jobs[job.job_id]
                self.outbound.put(_job_exit(job))
                self._changed.notify_all()

    # ------------------------------------------------------------------ the protocol

    def _accept(self) -> None:
        while True:
            try:
                connection = self._listener.accept()
            except Exception as exc:  # noqa: BLE001 - a bad client must not stop the agent
                if self._closing:
                    return
                logger.warning("refused a worker connection: %s", exc)
                continue
            if self._closing:
                connection.close()
                return
            threading.Thread(
                target=self._serve, args=(connection,), name="jigsaw-worker-conn", daemon=True
            ).start()

    def _serve(self, connection: Connection) -> None:
        with connection:
            try:
                hello = self._hello(connection)
                if hello is None:
                    return
                with self._lock:
                    job = self._jobs.get(hello["job_id"])
                    rank = job.ranks.get(hello["rank"]) if job is not None else None
                if job is None or rank is None or rank.process.pid != hello["pid"]:
                    logger.warning("a worker that is not ours said hello: %s", hello)
                    return
                rank.connected.set()
                try:
                    while True:
                        message = connection.recv()
                        if message["type"] == "check":
                            rank.watcher = connection
                            self._tell(job, rank)
                        else:
                            self._handle(job, rank, message)
                finally:
                    rank.disconnected.set()
            except (EOFError, ConnectionResetError):
                return  # the worker closed its end or died: it has said everything
            except (OSError, KeyError, TypeError) as exc:
                logger.warning("dropped a worker connection: %r", exc)

    def _hello(self, connection: Connection) -> dict[str, Any] | None:
        """The worker's hello; a pooled worker first waits idle until it gets a rank."""
        first: dict[str, Any] = connection.recv()
        if first.get("type") != "idle":
            return first
        pooled = self._idle(first["pid"], connection)
        if pooled is None:
            logger.warning("a warm worker that is not ours said idle: %s", first)
            return None
        try:
            hello: dict[str, Any] = connection.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._idle_connection_lost(pooled)
            return None
        return hello

    def _tell(self, job: _Job, rank: _Rank) -> None:
        """Send the job's decision to the rank watching it: the answer to its first
        check, then every change (the worker reads what arrived at each boundary
        without asking, so a boundary costs it no round trip)."""
        with rank.send_lock:
            if rank.watcher is None:
                return
            with self._lock:
                message = Decision(job.action, job.config_version, job.config).to_message()
            # A worker that is gone needs no decision: its exit says how it ended.
            with contextlib.suppress(OSError):
                rank.watcher.send(message)

    def _tell_rank0(self, job: _Job) -> None:
        rank = job.ranks.get(0)
        if rank is not None:
            self._tell(job, rank)

    def _handle(self, job: _Job, rank: _Rank, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "report":
            records = [agent_pb2.IterationRecord(**record) for record in message["records"]]
            if records:
                with self._lock:
                    job.iteration = max(job.iteration, records[-1].iteration)
                self.outbound.put(agent_pb2.JobIterations(job_id=job.job_id, records=records))
        elif kind == "evaluation":
            metrics = {name: float(value) for name, value in message["metrics"].items()}
            if rank.rank == 0:
                with self._lock:
                    job.metrics = metrics
            self.outbound.put(
                agent_pb2.Evaluation(
                    job_id=job.job_id, iteration=message["iteration"], metrics=metrics
                )
            )
        elif kind == "profile":
            self.outbound.put(
                agent_pb2.ModelProfileReport(
                    job_id=job.job_id,
                    workload=str(message["workload"]),
                    device_kind=self._slots[rank.gpu_index].kind,
                    profile_json=json.dumps(message["profile"]),
                )
            )
        elif kind == "exit":
            with self._lock:
                rank.exit_message = message
                job.iteration = max(job.iteration, message["iteration"])
        else:
            logger.warning(
                "job %d rank %d: unknown message %r",
                job.job_id,
                rank.rank,
                kind,
                extra={"job_id": job.job_id},
            )


# ---------------------------------------------------------------------- helpers


def _prepare_worker_user(
    worker_user: str | None, work_dir: Path, worker_env: Sequence[str]
) -> WorkerIdentity | None:
    """The identity workers run as, once it is known to be able to run them here."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=_PRIVATE_DIR_MODE)
    if worker_user is None:
        return None
    try:
        identity = resolve_worker_identity(worker_user)
    except ValueError as exc:
        raise IsolationError(str(exc)) from exc
    if identity is None:
        if os.geteuid() == 0:
            logger.warning(
                "training processes run as root (worker user %r): trial code can read "
                "every file on this host, the cluster token included",
                worker_user,
            )
        return identity
    blocked = unreachable(work_dir, identity)
    if blocked is not None:
        raise IsolationError(_unreachable_message(identity, work_dir, blocked))
    # Searchable, not listable: a worker reaches its own job directory by name.
    os.chmod(work_dir, _JOB_DIR_MODE_SHARED)
    give_to(work_dir / "data", identity)
    # Fail now, with the reason, rather than at every launch.
    check_runtime_runs(identity, _worker_env(identity, work_dir, worker_env))
    logger.info("training processes run as user %s (uid %d)", identity.name, identity.uid)
    return identity


def _worker_env(
    identity: WorkerIdentity | None, work_dir: Path, worker_env: Sequence[str]
) -> dict[str, str]:
    """The allow-listed environment; a worker of another user gets its own identity and
    the node's data directory as its home (for the caches libraries keep there)."""
    env = worker_environment(os.environ, worker_env)
    if identity is not None:
        env.update(HOME=str(work_dir / "data"), USER=identity.name, LOGNAME=identity.name)
    return env


def _as_user(identity: WorkerIdentity | None) -> dict[str, Any]:
    """Popen's arguments that run the child as `identity` (set in the child before exec,
    with no supplementary groups: root's must not carry over)."""
    if identity is None:
        return {}
    return {"user": identity.uid, "group": identity.gid, "extra_groups": []}


def _unreachable_message(identity: WorkerIdentity, path: Path, blocked: Path) -> str:
    return (
        f"worker user {identity.name} cannot reach {path}: it may not search {blocked} "
        f"(mode {blocked.stat().st_mode & 0o7777:o}). Give it search permission (o+x) on "
        "that directory, choose a directory it can reach (JIGSAW_AGENT_WORK_DIR, "
        "JIGSAW_GRPC_CHECKPOINT_DIR), or set JIGSAW_AGENT_WORKER_USER"
    )


def _wait_unreaped(process: subprocess.Popen[bytes]) -> None:
    """Wait for the process to exit, leaving it a zombie where the platform can.

    While the worker is a zombie its pid still names its process group, so leftovers of
    the group can be killed without hitting a stranger that reused the pid. (Python 3.11
    has no waitid on macOS, a dev box only: there leftovers are not killed.)
    """
    if _CAN_WAIT_UNREAPED:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    else:
        process.wait()


def _exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, without reaping it (its watcher does that)."""
    if not _CAN_WAIT_UNREAPED:
        return False
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None


def _drain(process: subprocess.Popen[bytes]) -> str:
    """The end of what an exited, never assigned pooled process printed."""
    if process.stdout is None:
        return ""
    with process.stdout as output:
        os.set_blocking(output.fileno(), False)  # a leftover grandchild may hold the pipe
        try:
            data = output.read() or b""
        except OSError:
            data = b""
    return data[-_IDLE_OUTPUT_TAIL_BYTES:].decode(errors="replace")


def _signal_ranks(job: _Job, signum: signal.Signals) -> None:
    """Signal the process group of every rank not yet reaped (caller holds the lock)."""
    for rank in job.ranks.values():
        if not rank.reaped:
            _signal_group(rank.process.pid, signum)


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pid, signum)


def json_object(text: str, name: str) -> dict[str, Any]:
    """`text` parsed as a JSON object, or a ValueError naming `name`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, not {type(value).__name__}")
    return value


def _failed_exit(job_id: int, message: str, attempt: int) -> agent_pb2.JobExit:
    return agent_pb2.JobExit(
        job_id=job_id, outcome=agent_pb2.OUTCOME_FAILED, error_tail=message, attempt=attempt
    )


def _job_exit(job: _Job) -> agent_pb2.JobExit:
    """One exit for all of a job's ranks on this node."""
    ranks = [job.ranks[rank] for rank in sorted(job.ranks)]
    codes = [rank.returncode if rank.returncode is not None else -1 for rank in ranks]
    exit_code = next((code for code in codes if code), 0)
    # Any other code (a crash, a signal, argparse's 2) is a failure.
    outcomes = [_OUTCOME_OF_CODE.get(code, Outcome.FAILED) for code in codes]
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
    iterations = [rank.exit_message["iteration"] for rank in ranks if rank.exit_message]
    logger.info(
        "job %d: %s (exit codes %s)", job.job_id, outcome.value, codes, extra={"job_id": job.job_id}
    )
    return agent_pb2.JobExit(
        job_id=job.job_id,
        attempt=job.attempt,
        outcome=_PROTO_OUTCOME[outcome],
        exit_code=exit_code,
        iteration=max(iterations, default=job.iteration),
        error_tail=error_tail,
        metrics=job.metrics,
    )


def _error_tail(rank: _Rank) -> str:
    """The worker's own account of its failure, else the end of its log."""
    if rank.exit_message and rank.exit_message.get("error_tail"):
        return str(rank.exit_message["error_tail"])[-_ERROR_TAIL_CHARS:]
    try:
        with rank.log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - _ERROR_TAIL_CHARS))
            tail = log.read().decode(errors="replace")
    except OSError as exc:
        tail = f"(no log: {exc})"
    return f"rank {rank.rank} exited with code {rank.returncode}\n{tail}"
