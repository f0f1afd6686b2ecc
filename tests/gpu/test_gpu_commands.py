"""The commands that measure on a GPU: `jigsaw profile --device cuda` and the benchmarks'
`--device cuda`, run as a user runs them (short)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.gpu import GPU_LANE
from tests.servers import JIGSAW, clean_env

pytestmark = GPU_LANE


def _run(home: Path, *command: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, env=clean_env(home), capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_profile_measures_on_cuda_under_the_gpus_name(tmp_path: Path) -> None:
    result = _run(
        tmp_path, *JIGSAW, "profile", "digits-cnn", "--workers", "2", "--batch-size", "32",
        "--repeats", "2", "--device", "cuda", "--json",
    )  # fmt: skip
    profile = json.loads(result.stdout)
    assert profile["device_kind"] == torch.cuda.get_device_name(0)
    assert len(profile["stages"]) == 2
    assert all(stage["forward_seconds"] > 0 for stage in profile["stages"])
    assert all(stage["activation_bytes"] > 0 for stage in profile["stages"])


def test_benchmarks_run_on_one_gpu(tmp_path: Path) -> None:
    python = sys.executable
    spb = _run(tmp_path, python, "-m", "benchmarks.spb", "--device", "cuda", "--rounds", "1",
               "--iterations", "2", "--small", "--json")  # fmt: skip
    rows = [json.loads(line) for line in spb.stdout.splitlines() if line.startswith("{")]
    partial = [row for row in rows if row["config"] != "off"]
    assert partial and all(0 < row["partial_peak_memory_ratio"] < 1 for row in partial)
    kfac = _run(tmp_path, python, "-m", "benchmarks.kfac", "--device", "cuda", "--workers", "1",
                "--iterations", "2", "--repeats", "1", "--warmup", "3", "--skip-training",
                "--json")  # fmt: skip
    rows = [json.loads(line) for line in kfac.stdout.splitlines() if line.startswith("{")]
    assert rows and all(row["inversion_ms"] > 0 and row["apply_ms"] > 0 for row in rows)
    ooo = _run(tmp_path, python, "-m", "benchmarks.ooo", "--device", "cuda", "--repeats", "1",
               "--iterations", "2", "--settings", "single-device", "--json")  # fmt: skip
    rows = [json.loads(line) for line in ooo.stdout.splitlines() if line.startswith("{")]
    assert {row["schedule"] for row in rows} >= {"standard"}
