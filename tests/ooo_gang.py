"""Running a function on a gang of spawned gloo processes and collecting what rank 0
returns, for the out-of-order backprop tests."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from api.server import free_port

_TIMEOUT_SECONDS = 120


def run_on_gang(world_size: int, function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` on every rank of a fresh gloo group; rank 0's result."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_member, args=(rank, world_size, port, function, args, results))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = dict(results.get(timeout=_TIMEOUT_SECONDS) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    failures = {rank: out for rank, out in outcomes.items() if isinstance(out, _Failure)}
    if failures:
        raise AssertionError("\n".join(f"rank {r}:\n{f.trace}" for r, f in failures.items()))
    return outcomes[0]


class _Failure:
    def __init__(self, trace: str) -> None:
        self.trace = trace


def _member(
    rank: int,
    world_size: int,
    port: int,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=_TIMEOUT_SECONDS),
        )
        result = function(*args)
        dist.destroy_process_group()
        results.put((rank, result))
    except BaseException:
        results.put((rank, _Failure(traceback.format_exc())))
