"""Choosing k of reverse first-k from a workload's per-stage profile.

One iteration is simulated for every k with the profile's measured costs: the dX chain
from the top, each of the top S-k stages computing its dW as the chain passes and the
first k computing theirs after it in forward order, every stage's gradient exchanged
as soon as it is complete on one shared link (a ring all-reduce of its parameters), and
the next forward running stage by stage once that stage's exchange is done. k is the
smallest number of stages, from the input side, that minimises the time from the
start of backward to the end of the next forward. It imports no torch.
"""

from __future__ import annotations

from jigsaw.spb import SPBProfile


def iteration_seconds(
    profile: SPBProfile, first_k: int, workers: int, bytes_per_second: float
) -> float:
    """Backward, exchanges and the next forward of one iteration under `first_k`."""
    stages = profile.stages
    ring = 2 * (workers - 1) / workers  # of the gradient, sent by each worker
    clock = link = 0.0
    exchanged = [0.0] * len(stages)

    def exchange(stage: int) -> None:
        nonlocal link
        link = max(clock, link) + ring * stages[stage].parameter_bytes / bytes_per_second
        exchanged[stage] = link

    for s in reversed(range(len(stages))):
        clock += stages[s].backward_input_seconds
        if s >= first_k:
            clock += stages[s].backward_weight_seconds
            exchange(s)
    for s in range(first_k):
        clock += stages[s].backward_weight_seconds
        exchange(s)
    for s, stage in enumerate(stages):
        clock = max(clock, exchanged[s]) + stage.forward_seconds
    return clock


def choose_first_k(profile: SPBProfile, workers: int, bytes_per_second: float) -> int:
    """The number of input-side stages whose dW should follow the dX chain."""
    if workers < 2 or bytes_per_second <= 0:
        raise ValueError(
            f"need 2+ workers and a positive bandwidth, got {workers}, {bytes_per_second}"
        )
    times = [
        iteration_seconds(profile, k, workers, bytes_per_second)
        for k in range(len(profile.stages) + 1)
    ]
    # Gains under 0.1% are not worth moving work away from standard backprop's order.
    best = min(times)
    return next(k for k, seconds in enumerate(times) if seconds <= best * 1.001)
