"""Scheduling policies: pure functions from a cluster snapshot to a plan, chosen by name."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.plan import Plan
from scheduler.policies import elastic_fifo, fifo, gandiva, jigsaw, srtf, tiresias
from scheduler.snapshot import ClusterSnapshot

Policy = Callable[[ClusterSnapshot], Plan]

POLICIES: dict[str, Policy] = {
    "fifo": fifo.schedule,
    "srtf": srtf.schedule,
    "tiresias": tiresias.schedule,
    "gandiva": gandiva.schedule,
    "jigsaw": jigsaw.schedule,
    "fifo-elastic": elastic_fifo.schedule,
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown scheduling policy {name!r}: known policies are {', '.join(sorted(POLICIES))}"
        ) from None
