"""Run one function as a gang of local processes in one gloo process group.

For measurements that need real collectives but not the agent: the SPB profiler's
statistical-efficiency runs, benchmarks, tests. Each rank runs in a spawned process
with one torch thread; what `target(rank, world_size, *args)` returns comes back by
rank, serialized with `torch.save` (a tensor passed as such would live in shared memory
its process takes with it when it exits).
"""

from __future__ import annotations

import faulthandler
import io
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.loop import run_worker


class GangError(RuntimeError):
    """A rank of the gang raised; the message carries its traceback."""


def free_local_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_local_gang(
    target: Callable[..., Any],
    world_size: int,
    *args: Any,
    init_group: bool = True,
    timeout_seconds: float = 600.0,
) -> list[Any]:
    """`target` must be importable by name (a module-level function): spawned
    processes re-import it. With `init_group=False` the target sets up its own group."""
    port = free_local_port() if init_group else None
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(
            target=_member,
            args=(target, rank, world_size, port, args, results, timeout_seconds),
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        returned: dict[int, Any] = {}
        for _ in processes:
            rank, ok, value = results.get(timeout=timeout_seconds)
            if not ok:
                raise GangError(f"rank {rank} failed:\n{value}")
            returned[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [returned[rank] for rank in range(world_size)]


def _member(
    target: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int | None,
    args: tuple[Any, ...],
    results: Any,
    timeout_seconds: float,
) -> None:
    # A rank still running when the gang gives up says where it hangs.
    faulthandler.dump_traceback_later(max(timeout_seconds - 5, 1), exit=False)
    torch.set_num_threads(1)
    if port is not None:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
    try:
        value = target(rank, world_size, *args)
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    buffer = io.BytesIO()
    torch.save(value, buffer)
    results.put((rank, True, buffer.getvalue()))


def run_workers(configs: list[WorkerConfig]) -> list[LocalController]:
    """The training runtime (`run_worker`) on one local process per config, each with a
    `LocalController` that continues at every boundary; the controllers after the run,
    by rank (rank 0's holds the iteration records, evaluations and exit status)."""
    payload = [config.model_dump_json() for config in configs]
    return run_local_gang(_run_worker_rank, len(configs), payload, init_group=False)


def _run_worker_rank(rank: int, world_size: int, configs: list[str]) -> LocalController:
    controller = LocalController()
    run_worker(WorkerConfig.model_validate_json(configs[rank]), controller)
    return controller
