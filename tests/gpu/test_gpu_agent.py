"""The agent on a GPU node: CUDA discovery, the start-up diagnosis, NVML's readings."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from tests.gpu import GPU_LANE
from worker_agent.diagnosis import diagnose
from worker_agent.gpus import discover, probe_cuda
from worker_agent.runtime.timing import CudaUtilization, utilization_meter
from worker_agent.settings import AgentSettings

pytestmark = GPU_LANE


def test_auto_serves_every_cuda_device_with_its_name_and_memory() -> None:
    probe = probe_cuda()
    slots = discover("auto", probe)
    assert len(slots) == torch.cuda.device_count()
    for slot in slots:
        properties = torch.cuda.get_device_properties(slot.index)
        assert not slot.virtual and slot.device == f"cuda:{slot.index}"
        assert (slot.kind, slot.memory_bytes) == (properties.name, properties.total_memory)
    assert probe.torch_version == torch.__version__
    assert probe.cuda_version == torch.version.cuda is not None
    assert probe.driver_version, "neither NVML nor /proc/driver/nvidia gave a driver version"


def test_the_diagnosis_names_the_gpus_driver_and_nccl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JIGSAW_HOME", str(tmp_path))
    settings = AgentSettings(token="t", node_name="gpu-node", work_dir=tmp_path, gpus="auto")
    probe = probe_cuda()
    lines = diagnose(settings, discover("auto", probe), probe)
    text = "\n".join(lines)
    assert lines[1].startswith(f"GPUs: {torch.cuda.device_count()} CUDA device(s): cuda:0 ")
    assert torch.cuda.get_device_name(0) in lines[1]
    assert lines[2].startswith(f"NVIDIA driver: {probe.driver_version}")
    assert f"torch built with CUDA {torch.version.cuda}" in lines[2]
    if torch.distributed.is_nccl_available():
        assert lines[3].startswith("NCCL: ") and "not" not in lines[3], text
    assert lines[4] == f"torch: {torch.__version__}"


def test_nvml_reports_the_utilization_of_a_busy_gpu() -> None:
    device = torch.device("cuda:0")
    meter = utilization_meter(device)
    assert isinstance(meter, CudaUtilization)
    matrix = torch.randn(4096, 4096, device=device)
    done = threading.Event()
    readings: list[float | None] = []

    def sample() -> None:
        while not done.wait(0.2):
            readings.append(meter.sample())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for _ in range(200):  # a few seconds of matrix products
            matrix = (matrix @ matrix).clamp_(-1, 1)
        torch.cuda.synchronize(device)
    finally:
        done.set()
        sampler.join()
    assert readings and None not in readings, "NVML unavailable: is nvidia-ml-py installed?"
    assert max(r for r in readings if r is not None) > 0.0
