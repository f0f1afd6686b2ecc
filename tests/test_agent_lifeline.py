"""A worker dies with the agent that started it (real processes, real SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster import alive
from worker_agent.runtime.lifeline import AGENT_PID_ENV

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

# A stand-in agent: starts a "worker" that asks for its lifeline, prints its pid, sleeps.
_AGENT = textwrap.dedent(
    f"""
    import os, subprocess, sys, time
    worker = (
        "from worker_agent.runtime.lifeline import die_with_agent\\n"
        "die_with_agent()\\n"
        "import os, sys, time\\n"
        "print(os.getpid(), flush=True)\\n"
        "time.sleep(600)\\n"
    )
    env = dict(os.environ, {AGENT_PID_ENV}=str(os.getpid()))
    subprocess.Popen([sys.executable, "-c", worker], env=env, start_new_session=True)
    time.sleep(600)
    """
)


def test_a_worker_is_killed_when_its_agent_is_sigkilled() -> None:
    agent = subprocess.Popen([sys.executable, "-c", _AGENT], stdout=subprocess.PIPE)
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        assert alive(worker)
        agent.kill()
        agent.wait()
        deadline = time.monotonic() + 30
        while alive(worker):
            assert time.monotonic() < deadline, "the worker outlived its SIGKILLed agent"
            time.sleep(0.05)
    finally:
        agent.kill()
        agent.wait()


def test_a_worker_whose_agent_is_already_gone_refuses_to_start() -> None:
    # The parent here is this test process, not the pid the environment names.
    result = subprocess.run(
        [sys.executable, "-m", "worker_agent.runtime.worker", "--pool",
         "--control", "127.0.0.1:1", "--authkey-env", "UNUSED"],
        env=dict(os.environ, **{AGENT_PID_ENV: "1"}),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert "the agent (pid 1) that started this worker is gone" in result.stderr
