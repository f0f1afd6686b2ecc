"""What separates a node's training processes, which run users' code, from the agent.

The agent is trusted and holds the cluster token; trial code is not. Each worker gets:

- a scrubbed environment: an allow-list of variables (`worker_environment`), so no
  `JIGSAW_*` setting and nothing named like a secret reaches user code;
- when the agent runs as root, another user (`JIGSAW_AGENT_WORKER_USER`, `nobody` by
  default; `WorkerIdentity`): the agent's token file, its `JIGSAW_HOME` and the control
  plane's files (0600, in a 0700 home) are out of its reach. The directories a worker
  needs are made its own (`give_to`) and must be reachable by it (`unreachable`);
- an agent it cannot inspect: the agent makes itself non-dumpable
  (`make_non_dumpable`), so a worker of the same user cannot read its memory or its
  `/proc/PID/environ`.
"""

from __future__ import annotations

import ctypes
import fnmatch
import logging
import os
import pwd
import re
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# What a training process may inherit from the agent's environment: the system's basics,
# locale, the Python and the accelerator stack's own knobs. Patterns as in fnmatch.
WORKER_ENV_ALLOWED: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "TMPDIR",
    "HOME",
    "USER",
    "LOGNAME",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONWARNINGS",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "CUDA_*",
    "NVIDIA_*",
    "NCCL_*",
    "GLOO_*",
    "TORCH_*",
    "TORCHINDUCTOR_*",
    "TRITON_*",
    "OMP_*",
    "MKL_*",
    "KMP_*",
)
# Never passed, whatever the allow-list says: names that look like a secret.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|(^|_)KEY($|_)", re.IGNORECASE)
# The agent's own namespace: its settings (the cluster token among them) and the
# control plane's, which a developer's shell may hold too.
_PRIVATE_PREFIX = "JIGSAW_"

_PR_SET_DUMPABLE = 4
_PROBE_SECONDS = 120.0


@dataclass(frozen=True)
class WorkerIdentity:
    """The user the agent (as root) runs training processes as."""

    name: str
    uid: int
    gid: int


def resolve_worker_identity(worker_user: str) -> WorkerIdentity | None:
    """The identity workers take, or None: they keep the agent's own.

    Only root can switch users: for any other agent, workers run as the agent's user
    and file permissions plus the scrubbed environment are their isolation. A worker
    user that is root itself (an explicit opt-out) is None too. Raises ValueError for
    a user this host does not know.
    """
    if os.geteuid() != 0:
        return None
    try:
        entry = (
            pwd.getpwuid(int(worker_user)) if worker_user.isdigit() else pwd.getpwnam(worker_user)
        )
    except KeyError:
        if not worker_user.isdigit():
            raise ValueError(
                f"worker user {worker_user!r} (JIGSAW_AGENT_WORKER_USER) does not exist on "
                "this host: create it or name another unprivileged user"
            ) from None
        # A bare uid (common in containers): its group is the same number.
        identity = WorkerIdentity(worker_user, int(worker_user), int(worker_user))
    else:
        identity = WorkerIdentity(entry.pw_name, entry.pw_uid, entry.pw_gid)
    return None if identity.uid == 0 else identity


def worker_environment(
    environ: Mapping[str, str], extra_allowed: Iterable[str] = ()
) -> dict[str, str]:
    """The variables of `environ` a training process inherits (see the module doc)."""
    patterns = (*WORKER_ENV_ALLOWED, *extra_allowed)
    return {
        name: value
        for name, value in environ.items()
        if not name.startswith(_PRIVATE_PREFIX)
        and not _SECRET_NAME.search(name)
        and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    }


def unreachable(path: Path, identity: WorkerIdentity) -> Path | None:
    """The first directory on the way to `path` (itself included) that `identity`
    cannot search, or None when it can reach `path`.

    Judged from the permission bits and owners (ACLs aside): enough to tell an operator
    which directory to open before a worker fails on it.
    """
    current = Path("/")
    for part in (path.resolve().parts)[1:]:
        current = current / part
        try:
            info = current.stat()
        except FileNotFoundError:
            return None  # created later, by whoever can reach its parent
        if not stat.S_ISDIR(info.st_mode):
            return None
        if not _permits(info, identity, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return current
    return None


def token_file_warning(token_file: Path | None, identity: WorkerIdentity | None) -> str | None:
    """Why training processes could read the agent's token file, or None."""
    if token_file is None:
        return None
    fix = (
        "pass the token in JIGSAW_AGENT_TOKEN instead (workers never see it), or run the "
        "agent as root with an unprivileged JIGSAW_AGENT_WORKER_USER"
    )
    if identity is None:
        return (
            f"training processes run as this agent's user and can read the cluster token "
            f"in {token_file}: {fix}"
        )
    info = token_file.stat()
    if unreachable(token_file.parent, identity) is None and _permits(
        info, identity, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH
    ):
        return (
            f"worker user {identity.name} can read the cluster token in {token_file} "
            f"(mode {info.st_mode & 0o7777:o}): make it readable by its owner only (0600)"
        )
    return None


def _permits(
    info: os.stat_result, identity: WorkerIdentity, user: int, group: int, other: int
) -> bool:
    if info.st_uid == identity.uid:
        return bool(info.st_mode & user)
    if info.st_gid == identity.gid:
        return bool(info.st_mode & group)
    return bool(info.st_mode & other)


def give_to(directory: Path, identity: WorkerIdentity) -> None:
    """Create `directory` (and its parents) and make it the worker user's, private."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, identity.uid, identity.gid, follow_symlinks=False)
    os.chmod(directory, 0o700, follow_symlinks=False)


def open_to_workers(home: Path, directories: Iterable[Path], identity: WorkerIdentity) -> None:
    """Let workers of `identity` reach `directories` in a private `home` (`jigsaw up`'s
    local agents as root): `home` and the directories in it on the way become
    searchable by others (mode | 0o011: no listing, and every file keeps its own mode).

    Raises IsolationError naming a directory the worker user still cannot search.
    """
    home = home.resolve()
    for directory in directories:
        directory = directory.resolve()
        directory.mkdir(parents=True, exist_ok=True, mode=0o711)
        if directory.is_relative_to(home):
            inside = directory.relative_to(home)
            for step in (home, *(home / p for p in reversed(inside.parents[:-1])), directory):
                step.chmod(step.stat().st_mode & 0o777 | 0o011)
        blocked = unreachable(directory, identity)
        if blocked is not None:
            raise IsolationError(
                f"local agents' training processes run as {identity.name}, who cannot reach "
                f"{directory}: it may not search {blocked}. Choose a JIGSAW_HOME (and "
                "JIGSAW_GRPC_CHECKPOINT_DIR) it can reach, e.g. under /var/lib, or set "
                "JIGSAW_AGENT_WORKER_USER"
            )


def check_runtime_runs(identity: WorkerIdentity, env: Mapping[str, str]) -> None:
    """Raise IsolationError unless `identity` can run this Python and import the
    training runtime from where it is installed (a Python under /root, say, it cannot)."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import worker_agent.runtime.protocol"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=dict(env),
            timeout=_PROBE_SECONDS,
            check=False,
            user=identity.uid,
            group=identity.gid,
            extra_groups=[],
        )
        output = (probe.stdout + probe.stderr).decode(errors="replace").strip()
        failure = f"exit code {probe.returncode}: {output[-1000:]}" if probe.returncode else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    if failure is not None:
        raise IsolationError(
            f"worker user {identity.name} cannot run {sys.executable} with the JigSaw "
            f"runtime ({failure}). Make the Python installation readable by that user, or "
            "set JIGSAW_AGENT_WORKER_USER"
        )


def make_non_dumpable() -> None:
    """Hide this process's memory, environment and open files from its own user's other
    processes (and disable its core dumps): workers of the same user cannot read them.

    Linux only; elsewhere (a developer's laptop) it does nothing.
    """
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))


class IsolationError(RuntimeError):
    """The agent cannot run training processes as configured; the message says why."""
