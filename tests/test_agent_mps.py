"""CUDA MPS on the agent: when it is used, how the agent drives the daemon, and the mode
each GPU is registered with. The daemon itself needs a GPU node (tests/gpu/test_gpu_mps.py);
here a stand-in `nvidia-cuda-mps-control` on PATH records what the agent asks of it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jigsaw.gpus import GpuSlot
from jigsaw.proto.v2 import agent_pb2
from worker_agent import mps, wire
from worker_agent.gpus import virtual_slots
from worker_agent.pool import ProcessPool
from worker_agent.settings import AgentSettings

H100 = [GpuSlot(index, "NVIDIA H100 80GB HBM3", 80 << 30, virtual=False) for index in (0, 1)]

# Logs its arguments, its pipe and log directories and what it read, one line per call;
# `get_server_list` fails once the log says `quit`, as the real one does when no daemon runs.
_STAND_IN = """#!/bin/sh
input=$(cat)
echo "$* | $CUDA_MPS_PIPE_DIRECTORY | $CUDA_MPS_LOG_DIRECTORY | $input" >> "{log}"
if [ "$input" = "get_server_list" ] && grep -q "| quit$" "{log}"; then exit 1; fi
exit 0
"""


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in control program first on PATH; returns its log."""
    bin_dir = tmp_path / "bin"
    log = bin_dir / "calls.log"  # beside the program: tests find it by the log
    bin_dir.mkdir()
    program = bin_dir / mps.CONTROL
    program.write_text(_STAND_IN.format(log=log))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_mps_is_wanted_only_on_cuda_nodes_that_have_it_and_not_turned_off(
    control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert mps.wanted("auto", H100)
    assert not mps.wanted("off", H100)
    assert not mps.wanted("auto", virtual_slots(2))  # CPU slots: nothing to share
    assert not mps.wanted("auto", [])
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no control program there
    assert not mps.wanted("auto", H100)


def test_the_setting_defaults_to_auto_and_refuses_other_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert AgentSettings(token="t").mps == "auto"
    assert AgentSettings(token="t").max_jobs_per_gpu == 4
    monkeypatch.setenv("JIGSAW_AGENT_MPS", "on")
    with pytest.raises(ValueError, match="mps"):
        AgentSettings(token="t")
    monkeypatch.setenv("JIGSAW_AGENT_MPS", "off")
    monkeypatch.setenv("JIGSAW_AGENT_MAX_JOBS_PER_GPU", "0")
    with pytest.raises(ValueError, match="max_jobs_per_gpu"):
        AgentSettings(token="t")


def test_the_agent_starts_its_own_daemon_points_workers_at_it_and_quits_it(
    control: Path, tmp_path: Path
) -> None:
    daemon = mps.MpsDaemon(tmp_path / "agent")
    assert daemon.start()
    assert daemon.alive()
    daemon.stop()
    assert not daemon.alive()
    pipes, logs = tmp_path / "agent/mps/pipe", tmp_path / "agent/mps/log"
    assert pipes.is_dir() and logs.is_dir()
    calls = control.read_text().splitlines()
    assert calls[0] == f"-d | {pipes} | {logs} | "
    assert calls[-2:] == [f" | {pipes} | {logs} | quit", f" | {pipes} | {logs} | get_server_list"]

    pool = ProcessPool(
        tmp_path / "agent",
        None,
        control_address="unused",
        authkey="k",
        torch_threads=1,
        mps_pipe_directory=daemon.pipe_directory,
    )
    assert pool._environment()["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)


def test_a_daemon_that_will_not_start_leaves_the_gpus_time_sliced(
    control: Path, tmp_path: Path
) -> None:
    control.parent.joinpath(mps.CONTROL).write_text("#!/bin/sh\necho no GPU >&2\nexit 1\n")
    assert not mps.MpsDaemon(tmp_path / "agent").start()


def test_each_gpu_is_registered_with_how_it_is_shared() -> None:
    assert [wire.gpu(slot).sharing for slot in mps.shared(H100)] == [agent_pb2.SHARING_MPS] * 2
    assert wire.gpu(H100[0]).sharing == agent_pb2.SHARING_TIME_SLICED
    assert wire.gpu(virtual_slots(1)[0]).sharing == agent_pb2.SHARING_TIME_SLICED
