"""Running a function on a gang of spawned gloo processes and collecting what rank 0
returns, for the out-of-order backprop tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker_agent.runtime.gang import run_local_gang

# A hung gang fails its test instead of the whole run.
_TIMEOUT_SECONDS = 120


def run_on_gang(world_size: int, function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` on every rank of a fresh gloo group; rank 0's result."""
    results = run_local_gang(_call, world_size, function, args, timeout_seconds=_TIMEOUT_SECONDS)
    return results[0]


def _call(rank: int, world_size: int, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return function(*args)
