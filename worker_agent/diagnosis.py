"""The agent's start-up diagnosis: what this node offers training, in one screen of log.

GPUs (name, memory), the NVIDIA driver and CUDA versions, NCCL, torch, and the free disk
where workers log and jobs checkpoint. It reads only what `gpus.probe_cuda` found (in a
child process) and the file system: it works without a GPU and without torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import platform
import shutil
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from jigsaw import __version__
from jigsaw.gpus import GpuSlot
from jigsaw.home import HomeSettings
from worker_agent.gpus import CudaProbe
from worker_agent.settings import AgentSettings

logger = logging.getLogger(__name__)

_GIB = 1024**3


def log_diagnosis(settings: AgentSettings, slots: list[GpuSlot], probe: CudaProbe | None) -> None:
    for line in diagnose(settings, slots, probe):
        logger.info("diagnosis: %s", line)


def diagnose(settings: AgentSettings, slots: list[GpuSlot], probe: CudaProbe | None) -> list[str]:
    """The diagnosis, a line each; `probe` is None when CUDA was not probed (`--gpus N`)."""
    return [
        f"jigsaw agent {__version__} on node {settings.node_name}, "
        f"Python {platform.python_version()}",
        _gpus(settings, slots, probe),
        _driver(probe),
        _nccl(slots, probe),
        _torch(probe),
        _disk(settings.work_dir, checkpoint_root()),
    ]


def _gpus(settings: AgentSettings, slots: list[GpuSlot], probe: CudaProbe | None) -> str:
    real = [slot for slot in slots if not slot.virtual]
    if real:
        return f"GPUs: {len(real)} CUDA device(s): " + "; ".join(
            f"cuda:{slot.index} {slot.kind} ({slot.memory_bytes / _GIB:.1f} GiB)" for slot in real
        )
    virtual = f"{len(slots)} virtual CPU slot(s) of {slots[0].memory_bytes / _GIB:.1f} GiB each"
    if probe is None:
        return f"GPUs: not probed (--gpus {settings.gpus}): {virtual}"
    if probe.torch_version is None:
        return f"GPUs: none found (torch cannot be imported to ask): {virtual}"
    why = "torch is a CPU build" if probe.cuda_version is None else "CUDA sees no device"
    return f"GPUs: none found ({why}): {virtual}"


def _driver(probe: CudaProbe | None) -> str:
    if probe is None:
        return "NVIDIA driver: not probed"
    built = f"; torch built with CUDA {probe.cuda_version}" if probe.cuda_version else ""
    if probe.driver_version is None:
        return f"NVIDIA driver: none found{built}"
    supports = (
        f" (supports CUDA up to {probe.driver_cuda_version})" if probe.driver_cuda_version else ""
    )
    return f"NVIDIA driver: {probe.driver_version}{supports}{built}"


def _nccl(slots: list[GpuSlot], probe: CudaProbe | None) -> str:
    if probe is not None and probe.nccl_version is not None:
        return f"NCCL: {probe.nccl_version} (jobs on these GPUs communicate with it)"
    if any(not slot.virtual for slot in slots):
        return "NCCL: not available in this torch: multi-GPU jobs here will fail"
    return "NCCL: not used (virtual slots communicate with gloo)"


def _torch(probe: CudaProbe | None) -> str:
    if probe is not None:
        if probe.torch_version is None:
            return f"torch: cannot be imported ({probe.torch_error}): jobs here will fail"
        return f"torch: {probe.torch_version}"
    # Not probed: read the installed version without importing torch into the agent.
    try:
        return f"torch: {importlib.metadata.version('torch')} (installed; not imported)"
    except importlib.metadata.PackageNotFoundError:
        if importlib.util.find_spec("torch") is not None:
            return "torch: present, version unknown (no package metadata)"
        return "torch: not installed: jobs here will fail"


class _CheckpointSetting(BaseSettings):
    """The scheduler's JIGSAW_GRPC_CHECKPOINT_DIR, as this node's environment gives it."""

    model_config = SettingsConfigDict(env_prefix="JIGSAW_GRPC_", extra="ignore")

    checkpoint_dir: Path | None = None


def checkpoint_root() -> Path:
    """Where jobs checkpoint by default: JIGSAW_GRPC_CHECKPOINT_DIR, else
    `$JIGSAW_HOME/checkpoints`."""
    try:
        configured = _CheckpointSetting().checkpoint_dir
    except ValidationError:
        configured = None
    return configured or HomeSettings().home / "checkpoints"


def _disk(work_dir: Path, checkpoints: Path) -> str:
    return (
        f"free disk: {_free(work_dir)} at {work_dir} (worker logs), "
        f"{_free(checkpoints)} at {checkpoints} (checkpoints)"
    )


def _free(path: Path) -> str:
    """Free space of the file system that holds `path` (or would: its nearest parent)."""
    for candidate in (path, *path.parents):
        try:
            return f"{shutil.disk_usage(candidate).free / _GIB:.1f} GiB"
        except OSError:
            continue
    return "unknown"
