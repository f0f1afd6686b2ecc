"""Worker processes: how they are started, kept warm, signalled and reaped.

A worker is `python -m worker_agent.runtime.worker` in its own process group (a stop
signals it and whatever it started), with the allow-listed environment and, when the
agent runs as root, as the worker user (`isolation`). Every worker is forked by one
thread, which lives as long as the pool: workers ask for PR_SET_PDEATHSIG
(`lifeline`), which fires when the *thread* that forked them ends.

Warm pool: with `warm` > 0 the pool keeps that many workers started with `--pool`,
which import torch and the runtime and then wait idle on their connection to the
agent (`channel`). `take_idle` hands a rank to an idle one (sending it the rank's
configuration); a background thread then tops the pool up again. What a pooled worker
printed while idle (import warnings) stays in its pipe and lands in its rank's log. One
that dies while idle is replaced; one that dies before it ever got idle counts as a
failure, and failures in a row slow the replacements down (a broken installation must
not fork in a loop).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

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
from worker_agent.runtime.protocol import assign_message

logger = logging.getLogger(__name__)

_AUTHKEY_ENV = "JIGSAW_WORKER_AUTHKEY"
# Logs and configurations in a job directory are the agent's; a worker of another user
# may only reach its own configuration by name (search, no listing, no writing).
JOB_DIR_MODE_SHARED = 0o711
PRIVATE_DIR_MODE = 0o700
_POOL_BACKOFF_MAX_SECONDS = 60.0
_IDLE_OUTPUT_TAIL_BYTES = 4000

_CAN_WAIT_UNREAPED = hasattr(os, "waitid")


@dataclass(eq=False)
class _Pooled:
    """A warm worker: idle until it is given a rank, whose end `on_exit` then reports."""

    process: subprocess.Popen[bytes]
    connection: Connection | None = None  # set once it said idle: it can take a rank
    on_exit: Callable[[], None] | None = None  # set once it took a rank


class ProcessPool:
    def __init__(
        self,
        work_dir: Path,
        identity: WorkerIdentity | None,
        *,
        control_address: str,
        authkey: str,
        torch_threads: int,
        worker_env: Sequence[str] = (),
        warm: int = 0,
        mps_pipe_directory: Path | None = None,
    ) -> None:
        """Workers dial `control_address` and prove `authkey`; they run as `identity`
        (None: as this process) and get `worker_env` beyond the allow-list, and the MPS
        daemon's pipe directory when the agent runs one."""
        self._work_dir = work_dir
        self._identity = identity
        self._control_address = control_address
        self._authkey = authkey
        self._torch_threads = torch_threads
        self._worker_env = tuple(worker_env)
        self._mps_pipe_directory = mps_pipe_directory
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="jigsaw-spawner")
        self._changed = threading.Condition()
        self._warm = warm
        self._pool: list[_Pooled] = []  # not given a rank yet: starting or idle
        self._closing = threading.Event()
        self._failures = 0  # pooled processes in a row that died before idle
        self._refiller = threading.Thread(
            target=self._keep_pool, name="jigsaw-warm-pool", daemon=True
        )
        if warm:
            self._refiller.start()

    def spawn(self, config_path: Path) -> subprocess.Popen[bytes]:
        """A worker started cold for the configuration at `config_path`."""
        return self._spawner.submit(self._popen, config_path).result()

    def take_idle(
        self, config: WorkerConfig, on_exit: Callable[[], None]
    ) -> subprocess.Popen[bytes] | None:
        """An idle warm worker now running `config`, or None; `on_exit` is called once it
        has exited (not reaped)."""
        with self._changed:
            while True:
                pooled = next((p for p in self._pool if p.connection is not None), None)
                if pooled is None:
                    return None
                self._pool.remove(pooled)
                self._changed.notify_all()  # the refiller tops the pool up
                assert pooled.connection is not None
                # Gone but not yet noticed by its watcher: it must not take the rank.
                if not exited(pooled.process):
                    try:
                        pooled.connection.send(assign_message(config.model_dump(mode="json")))
                        pooled.on_exit = on_exit
                        return pooled.process
                    except OSError as exc:
                        logger.warning("warm worker %d unreachable: %s", pooled.process.pid, exc)
                # Back in the pool as not idle, so that its watcher reaps it as a pooled one.
                pooled.connection = None
                self._pool.append(pooled)
                signal_group(pooled.process.pid, signal.SIGKILL)

    def idle(self, pid: int, connection: Connection) -> bool:
        """Note that warm worker `pid` is ready for a rank on `connection`; False when
        `pid` is none of ours."""
        with self._changed:
            pooled = next((p for p in self._pool if p.process.pid == pid), None)
            if pooled is None:
                return False
            pooled.connection = connection
            self._failures = 0
            logger.info("warm worker %d idle, ready for a rank", pid)
            return True

    def idle_connection_lost(self, pid: int) -> None:
        """Its connection broke while idle: useless now, so it is killed and replaced."""
        with self._changed:
            pooled = next((p for p in self._pool if p.process.pid == pid), None)
            if pooled is not None:
                pooled.connection = None
                signal_group(pid, signal.SIGKILL)

    def idle_pids(self) -> list[int]:
        """Process ids of the warm workers ready to take a rank (for tests)."""
        with self._changed:
            return [p.process.pid for p in self._pool if p.connection is not None]

    def close(self) -> None:
        """No more warm workers; the idle ones are killed (their watchers reap them)."""
        with self._changed:
            self._closing.set()
            self._changed.notify_all()
            for pooled in self._pool:
                signal_group(pooled.process.pid, signal.SIGKILL)
        if self._refiller.is_alive():
            self._refiller.join()

    def join(self, timeout: float) -> None:
        """After `close`: wait for the warm workers to be reaped, then stop forking."""
        with self._changed:
            if not self._changed.wait_for(lambda: not self._pool, timeout=timeout):
                logger.error("%d warm workers did not end", len(self._pool))
        self._spawner.shutdown()

    # ------------------------------------------------------------------ starting

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
                self._control_address,
                "--authkey-env",
                _AUTHKEY_ENV,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self._environment(),
            **_as_user(self._identity),
            # Its own process group: a stop signals the worker and whatever it started.
            # No preexec_fn: forking this multi-threaded process (gRPC's threads among
            # them) to run Python before exec can deadlock the child; the worker sets up
            # its own death signal instead (`lifeline`).
            start_new_session=True,
        )

    def _environment(self) -> dict[str, str]:
        """A worker's environment: the allow-listed part of ours, and what it needs."""
        env = worker_env(self._identity, self._work_dir, self._worker_env)
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
        if self._mps_pipe_directory is not None:
            # CUDA clients find the agent's MPS daemon here (not the system default).
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(self._mps_pipe_directory)
        return env

    # ------------------------------------------------------------------ the warm pool

    def _keep_pool(self) -> None:
        """Keep `warm` pooled processes, starting or idle, until the pool closes."""
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: self._closing.is_set() or len(self._pool) < self._warm
                )
                failures = self._failures
            if failures and self._closing.wait(
                min(_POOL_BACKOFF_MAX_SECONDS, 2.0 ** (failures - 1))
            ):
                return
            if self._closing.is_set():
                return
            try:
                process = self._spawner.submit(self._popen, None).result()
            except OSError as exc:
                logger.error("could not start a warm worker: %s", exc)
                with self._changed:
                    self._failures += 1
                continue
            pooled = _Pooled(process)
            with self._changed:
                self._pool.append(pooled)
                if self._closing.is_set():  # close() did not see it: kill it here
                    signal_group(process.pid, signal.SIGKILL)
            threading.Thread(
                target=self._watch_pooled,
                args=(pooled,),
                name=f"jigsaw-warm-{process.pid}",
                daemon=True,
            ).start()

    def _watch_pooled(self, pooled: _Pooled) -> None:
        """Wait for a pooled process to exit: replace it while idle, else end its rank."""
        wait_unreaped(pooled.process)
        with self._changed:
            on_exit = pooled.on_exit
            if on_exit is None:
                self._reap_unassigned(pooled)
                self._changed.notify_all()  # the refiller and join() wait on the pool
                return
        on_exit()

    def _reap_unassigned(self, pooled: _Pooled) -> None:
        """Reap a pooled process that died before taking a rank (lock held)."""
        process = pooled.process
        returncode = reap(process)
        self._pool.remove(pooled)
        output = _drain(process)
        if self._closing.is_set():
            return
        if pooled.connection is None:
            self._failures += 1  # never got idle: maybe broken for good, slow down
        logger.warning(
            "warm worker %d exited with code %d while idle; replacing it. Its output:\n%s",
            process.pid,
            returncode,
            output,
        )


# ---------------------------------------------------------------------- the worker user


def prepare_worker_user(
    worker_user: str | None, work_dir: Path, worker_env_names: Sequence[str]
) -> WorkerIdentity | None:
    """The identity workers run as, once it is known to be able to run them here.
    Raises IsolationError when it could not."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
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
        raise IsolationError(unreachable_message(identity, work_dir, blocked))
    # Searchable, not listable: a worker reaches its own job directory by name.
    os.chmod(work_dir, JOB_DIR_MODE_SHARED)
    give_to(work_dir / "data", identity)
    # Fail now, with the reason, rather than at every launch.
    check_runtime_runs(identity, worker_env(identity, work_dir, worker_env_names))
    logger.info("training processes run as user %s (uid %d)", identity.name, identity.uid)
    return identity


def worker_env(
    identity: WorkerIdentity | None, work_dir: Path, worker_env_names: Sequence[str]
) -> dict[str, str]:
    """The allow-listed environment; a worker of another user gets its own identity and
    the node's data directory as its home (for the caches libraries keep there)."""
    env = worker_environment(os.environ, worker_env_names)
    if identity is not None:
        env.update(HOME=str(work_dir / "data"), USER=identity.name, LOGNAME=identity.name)
    return env


def unreachable_message(identity: WorkerIdentity, path: Path, blocked: Path) -> str:
    return (
        f"worker user {identity.name} cannot reach {path}: it may not search {blocked} "
        f"(mode {blocked.stat().st_mode & 0o7777:o}). Give it search permission (o+x) on "
        "that directory, choose a directory it can reach (JIGSAW_AGENT_WORK_DIR, "
        "JIGSAW_GRPC_CHECKPOINT_DIR), or set JIGSAW_AGENT_WORKER_USER"
    )


def _as_user(identity: WorkerIdentity | None) -> dict[str, Any]:
    """Popen's arguments that run the child as `identity` (set in the child before exec,
    with no supplementary groups: root's must not carry over)."""
    if identity is None:
        return {}
    return {"user": identity.uid, "group": identity.gid, "extra_groups": []}


# ---------------------------------------------------------------------- signals, reaping


def wait_unreaped(process: subprocess.Popen[bytes]) -> None:
    """Wait for the process to exit, leaving it a zombie where the platform can.

    While the worker is a zombie its pid still names its process group, so leftovers of
    the group can be killed without hitting a stranger that reused the pid. (Python 3.11
    has no waitid on macOS, a dev box only: there leftovers are not killed.)
    """
    if _CAN_WAIT_UNREAPED:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    else:
        process.wait()


def reap(process: subprocess.Popen[bytes]) -> int:
    """Kill what is left of an exited worker's process group, then reap the worker: its
    pid (and group id) may be reused from then on. Returns its exit code."""
    if _CAN_WAIT_UNREAPED:
        signal_group(process.pid, signal.SIGKILL)
    return process.wait()


def exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, without reaping it (its watcher does that)."""
    if not _CAN_WAIT_UNREAPED:
        return False
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None


def signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pid, signum)


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
