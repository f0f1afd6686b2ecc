"""k of reverse first-k chosen on a running gang: rank 0's choice from its profile and
link measurement is what every rank's schedule uses."""

from __future__ import annotations

import math

import torch
from torch import nn

from jigsaw.spb import SPBProfile, StageProfile
from worker_agent.runtime.gang import run_local_gang
from worker_agent.runtime.ooo.gang_first_k import agree_first_k, link_bytes_per_second
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK

_TIMEOUT_SECONDS = 120


def _profile(stages: int) -> SPBProfile:
    # As in test_ooo_first_k: at 1 B/s on 2 workers the first 2 of 4 stages go after the
    # chain; with free communication none does.
    stage = StageProfile(1.0, 1.0, 1.0, activation_bytes=0, parameter_bytes=1)
    return SPBProfile("test", 8, (stage,) * stages, {})


def _choose(rank: int, world_size: int, bandwidths: list[float]) -> tuple[int, int, float]:
    """On every rank: agree on k for a 4-stage MLP (two layers in the first stage) with
    this rank's bandwidth, run one step; the agreed k (stages), the schedule's k
    (layers) and the measured link."""
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    model = nn.Sequential(first, nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1))
    schedule = ReverseFirstK(model, torch.optim.SGD(model.parameters(), lr=0.1))
    profile = _profile(4) if rank == 0 else None
    k = agree_first_k(schedule, list(model), profile, bandwidths[rank])
    schedule.zero_grad()
    schedule.backward(model(torch.randn(2, 4)).sum())
    schedule.step()
    schedule.flush()
    return k, schedule.first_k, link_bytes_per_second(torch.device("cpu"))


def test_every_rank_takes_rank_zeros_choice_in_layers_of_the_chosen_stages() -> None:
    # Rank 1's own figure would choose k = 0: rank 0 decides for the gang.
    slow = run_local_gang(_choose, 2, [1.0, 1e12], timeout_seconds=_TIMEOUT_SECONDS)
    # Stages 0 and 1 hold three layers.
    assert [(k, layers) for k, layers, _ in slow] == [(2, 3), (2, 3)]
    free = run_local_gang(_choose, 2, [1e12, 1.0], timeout_seconds=_TIMEOUT_SECONDS)
    assert [(k, layers) for k, layers, _ in free] == [(0, 0), (0, 0)]
    for _, _, bandwidth in [*slow, *free]:
        assert 0 < bandwidth < math.inf
