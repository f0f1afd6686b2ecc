"""Scheduling policies: pure functions from a cluster snapshot to a plan, chosen by name."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.policies import fifo, gandiva, jigsaw, srtf, tiresias

Policy = Callable[[ClusterSnapshot], Plan]

POLICIES: dict[str, Policy] = {
    "fifo": fifo.schedule,
    "srtf": srtf.schedule,
    "tiresias": tiresias.schedule,
    "gandiva": gandiva.schedule,
    "jigsaw": jigsaw.schedule,
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown scheduling policy {name!r}: known policies are {', '.join(sorted(POLICIES))}"
        ) from None
