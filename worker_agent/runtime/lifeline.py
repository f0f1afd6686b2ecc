"""A worker process dies with the agent that started it.

A SIGKILLed agent cannot stop its workers, which would train on as orphans holding their
GPUs. With PR_SET_PDEATHSIG the kernel kills the worker when its parent goes. The worker
asks for it itself, first thing, rather than the agent between fork and exec: running
Python in a child forked from the agent's many threads (gRPC's among them) can deadlock
before exec. The agent's pid comes in the environment, so that a worker whose agent died
before it got here notices (its parent is already someone else) and exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

AGENT_PID_ENV = "JIGSAW_WORKER_AGENT_PID"
_PR_SET_PDEATHSIG = 1


class OrphanedError(RuntimeError):
    """The agent that started this worker is gone already."""


def die_with_agent() -> None:
    """Be killed when the agent that started us dies; raise if it is gone already.

    Does nothing when not started by an agent (no AGENT_PID_ENV, e.g. tests running a
    worker in-process). Off Linux (a dev box) there is no PDEATHSIG: only the check runs.
    """
    expected = os.environ.get(AGENT_PID_ENV)
    if expected is None:
        return
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(expected):
        raise OrphanedError(f"the agent (pid {expected}) that started this worker is gone")
