"""A child process dies with the process that started it.

A SIGKILLed agent cannot stop its workers, which would train on as orphans holding their
GPUs; a SIGKILLed `jigsaw up` cannot stop its local agents, which would serve on beside
the ones its restart starts, under the same node names. With PR_SET_PDEATHSIG the kernel
kills the child when its parent goes. The child asks for it itself, first thing, rather
than the parent between fork and exec: running Python in a child forked from the
parent's many threads (gRPC's among them) can deadlock before exec. The parent's pid
comes in the environment, so that a child whose parent died before it got here notices
(its parent is already someone else) and exits.

The same holds one level up: a `jigsaw up` started by the demo dies with the demo.

Local agents also hold a lifeline pipe: their stdin, whose other end only `jigsaw up`
holds. It reads end-of-file once `jigsaw up` is gone, however it went, also where there
is no PDEATHSIG (off Linux), and the agent then shuts down.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import BinaryIO

AGENT_PID_ENV = "JIGSAW_WORKER_AGENT_PID"
# JIGSAW_AGENT_*: the supervisor keeps it from the agent's workers with the agent's settings.
UP_PID_ENV = "JIGSAW_AGENT_PARENT_PID"
# Set by a program that starts `jigsaw up` for itself (the demo): `up`, and with it its
# local agents and their workers, never outlive it.
UP_PARENT_PID_ENV = "JIGSAW_UP_PARENT_PID"
_PR_SET_PDEATHSIG = 1


class OrphanedError(RuntimeError):
    """The process that started this one is gone already."""


def die_with_agent() -> None:
    """A worker: be killed when the agent that started it dies (see `die_with_parent`)."""
    die_with_parent(AGENT_PID_ENV, "the agent (pid {pid}) that started this worker is gone")


def die_with_parent(env: str, orphaned: str) -> bool:
    """Be killed when the parent named in environment variable `env` dies; raise
    OrphanedError (`orphaned`, formatted with the parent's pid) if it is gone already.
    False (and nothing done) when `env` is unset (not started that way, e.g. tests
    running a worker in-process).

    Off Linux (a dev box) there is no PDEATHSIG: only the check runs.
    """
    expected = os.environ.get(env)
    if expected is None:
        return False
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(expected):
        raise OrphanedError(orphaned.format(pid=expected))
    return True


def watch_lifeline(pipe: BinaryIO, lost: threading.Event) -> None:
    """Set `lost` once the lifeline pipe reads end-of-file (its writer is gone)."""

    def watch() -> None:
        while pipe.read(4096):
            pass
        lost.set()

    threading.Thread(target=watch, name="jigsaw-lifeline", daemon=True).start()
