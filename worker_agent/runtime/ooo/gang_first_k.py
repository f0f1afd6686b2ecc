"""Reverse first-k's k chosen on the running gang, for `backprop: ooo` jobs that leave
`ooo_first_k` to the platform.

`choose_first_k` needs the model's per-stage costs and the link's speed. The speed is
measured where the job runs: one all-reduce of a known size, timed after a warm-up one,
read as the bandwidth its model assumes (a ring all-reduce sends 2(w-1)/w of the
tensor per worker). Rank 0 chooses from its profile and its measurement, and every
rank takes its k, so the schedule launches exchanges in the same order everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from jigsaw.spb import SPBProfile
from worker_agent.runtime.ooo.first_k import choose_first_k
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK

# Large enough that per-message latency is a small part of the time, small enough to
# cost well under a second on a slow link.
PROBE_BYTES = 4 * 2**20


def link_bytes_per_second(device: torch.device, probe_bytes: int = PROBE_BYTES) -> float:
    """Collective: the bandwidth of the default group as `choose_first_k` models it."""
    probe = torch.zeros(probe_bytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(probe)  # warm-up: connections, buffers
    _synchronize(device)
    start = time.perf_counter()
    dist.all_reduce(probe)
    _synchronize(device)
    seconds = time.perf_counter() - start
    workers = dist.get_world_size()
    return 2 * (workers - 1) / workers * probe_bytes / seconds


def agree_first_k(
    schedule: ReverseFirstK,
    stages: Sequence[nn.Module],
    profile: SPBProfile | None,
    bytes_per_second: float,
) -> int:
    """Collective: k (in stages) chosen by rank 0 from its `profile` (None elsewhere) and
    `bytes_per_second`, and set on every rank's `schedule` from its next backward on."""
    choice: list[int | None] = [None]
    if dist.get_rank() == 0:
        if profile is None or len(profile.stages) != len(stages):
            raise ValueError(f"rank 0 needs a profile of the {len(stages)} stages")
        choice[0] = choose_first_k(profile, dist.get_world_size(), bytes_per_second)
    dist.broadcast_object_list(choice, src=0)
    k = choice[0]
    assert isinstance(k, int)
    schedule.first_k_of_stages(stages, k)
    return k


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
