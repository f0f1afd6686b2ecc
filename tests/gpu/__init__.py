"""The GPU lane: tests of every CUDA path, marked `gpu` and skipped without CUDA.

`./dev test --gpu` runs only these (`pytest -m gpu`); CI has no GPU and never needs them.
Tests that need more devices than the machine has say how many in their skip reason.
"""

from __future__ import annotations

import pytest
import torch

CUDA_DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0

# Every module of the lane: `pytestmark = GPU_LANE`.
GPU_LANE = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUDA_DEVICES == 0, reason="needs a CUDA device"),
]


def needs_gpus(count: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        count > CUDA_DEVICES, reason=f"needs {count} CUDA devices; {CUDA_DEVICES} here"
    )
