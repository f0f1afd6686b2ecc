"""The real CUDA MPS daemon the agent supervises: a CUDA worker joins it through the
agent's pipe directory. Needs a GPU node whose driver ships `nvidia-cuda-mps-control`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu import GPU_LANE
from worker_agent import mps

pytestmark = [
    *GPU_LANE,
    pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason=f"no {mps.CONTROL} on PATH"),
]


def test_a_cuda_process_runs_under_the_agents_daemon(tmp_path: Path) -> None:
    daemon = mps.MpsDaemon(tmp_path)
    assert daemon.start()
    try:
        environment = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_directory)}
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import torch; print((torch.ones(8, device='cuda') * 2).sum().item())",
            ],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0 and done.stdout.strip() == "16.0", done.stderr
        # The client made the daemon start a server: its log says so.
        assert "Starting new server" in (daemon.log_directory / "control.log").read_text()
        assert daemon.alive()
    finally:
        daemon.stop()
