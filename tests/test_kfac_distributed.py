"""Distributed K-FAC on real gloo process groups.

With equal local batches, K-FAC over 1, 2 or 4 workers must precondition exactly as one
process does on the global batch; the pipelined, fused, balanced exchange must produce
the very same bits as the naive per-layer one; factors of a stage some workers do not
backpropagate are averaged over its contributors only.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from worker_agent.runtime.kfac import KFACPreconditioner, KFACSettings
from worker_agent.runtime.kfac.exchange import FactorExchange

GLOBAL_BATCH = 8
WORLD_SIZES = (1, 2, 4)
STEPS = 3
# Every step inverts, the fusion plan is fitted after the first step.
_FAST = KFACSettings(inv_update_steps=1, factor_decay=0.5, profile_steps=1, kl_clip=1.0)


def _model() -> nn.Module:
    torch.manual_seed(0)
    # float64: the damped solve amplifies float32 rounding beyond a meaningful tolerance.
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 4 * 4, 5),
        nn.ReLU(),
        nn.Linear(5, 3),
    ).double()


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(GLOBAL_BATCH, 2, 4, 4, generator=generator, dtype=torch.float64),
            torch.randint(3, (GLOBAL_BATCH,), generator=generator),
        )
        for _ in range(STEPS)
    ]


def _preconditioned(
    model: nn.Module,
    preconditioner: KFACPreconditioner,
    batches: list[tuple[torch.Tensor, ...]],
    group: dist.ProcessGroup | None = None,
) -> list[list[torch.Tensor]]:
    """The preconditioned gradients of every step (the model itself is not updated)."""
    steps = []
    for inputs, targets in batches:
        model.zero_grad()
        F.cross_entropy(model(inputs), targets).backward()
        if group is not None:
            # What DDP does in backward (DDP itself costs seconds of imports per process).
            for parameter in model.parameters():
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad, group=group)
                parameter.grad /= dist.get_world_size(group)
        preconditioner.step(learning_rate=0.1)
        steps.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return steps


def _member(rank: int, port: int) -> None:
    """Rank `rank` of 4 processes; groups of the first 1, 2 and 4 of them are the runs."""
    torch.set_num_threads(1)
    batches = _batches()
    reference_model = _model()
    reference = _preconditioned(
        reference_model, KFACPreconditioner(reference_model, _FAST), batches
    )
    # One process's first factors on rank 0's shard of each world size, and on all.
    x, y = batches[0]
    first = {
        size: _first_factors(x[: GLOBAL_BATCH // size], y[: GLOBAL_BATCH // size])
        for size in WORLD_SIZES
    }
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=max(WORLD_SIZES)
    )
    try:
        for world_size in WORLD_SIZES:
            ranks = list(range(world_size))
            # Every process takes part in creating every group, member or not.
            groups = [dist.new_group(ranks) for _ in range(3)]
            if rank < world_size:
                _check_world(rank, world_size, groups, batches, reference, first)
    finally:
        dist.destroy_process_group()


def _check_world(
    rank: int,
    world_size: int,
    groups: list[dist.ProcessGroup],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    reference: list[list[torch.Tensor]],
    first: dict[int, dict[str, torch.Tensor]],
) -> None:
    local = GLOBAL_BATCH // world_size
    shards = [
        (x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local])
        for x, y in batches
    ]
    naive = replace(_FAST, pipelined=False, fusion=False, placement="round-robin")
    gradients, kfac_groups = groups[0], groups[1:]
    runs = {}
    for (name, settings), group in zip(
        (("fused", _FAST), ("naive", naive)), kfac_groups, strict=True
    ):
        model = _model()
        preconditioner = KFACPreconditioner(model, settings, group=group)
        grads = _preconditioned(model, preconditioner, shards, gradients)
        runs[name] = (grads, preconditioner.state_dict()["factors"])
    for step, expected in enumerate(reference):
        for name in runs:
            for got, want in zip(runs[name][0][step], expected, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    fused_factors, naive_factors = runs["fused"][1], runs["naive"][1]
    assert fused_factors.keys() == naive_factors.keys()
    for name, factor in fused_factors.items():
        assert torch.equal(factor, naive_factors[name]), name
    if world_size > 1:
        _check_exchange(rank, world_size, gradients)
        _check_partial_backprop(rank, kfac_groups[0], shards[0], first[world_size], first[1])


def _first_factors(inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    model = _model()
    preconditioner = KFACPreconditioner(model, _FAST)
    _preconditioned(model, preconditioner, [(inputs, targets)])
    factors: dict[str, torch.Tensor] = preconditioner.state_dict()["factors"]
    return factors


def _check_partial_backprop(
    rank: int,
    group: dist.ProcessGroup,
    shard: tuple[torch.Tensor, torch.Tensor],
    rank0: dict[str, torch.Tensor],
    everyone: dict[str, torch.Tensor],
) -> None:
    """SPB: only rank 0 backpropagates into the first layer (the convolution); the
    others run it without gradients. Its factors are rank 0's alone; the other
    layers' are the global batch's."""
    model = _model()
    preconditioner = KFACPreconditioner(
        model, _FAST, group=group, contributors={"0": frozenset({0})}
    )
    inputs, targets = shard
    with torch.set_grad_enabled(rank == 0):
        hidden = model[0](inputs)
    F.cross_entropy(model[1:](hidden), targets).backward()
    preconditioner.step(learning_rate=0.1)
    got = preconditioner.state_dict()["factors"]
    for name, factor in got.items():
        want = rank0[name] if name.startswith("0/") else everyone[name]
        torch.testing.assert_close(factor, want, rtol=1e-9, atol=1e-12, msg=name)


def _factor(rank: int, index: int, dim: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * rank + index)
    sample = torch.randn(dim, dim, generator=generator) * 10.0 ** (index - 2)
    return sample @ sample.T


def _check_exchange(rank: int, world_size: int, group: dist.ProcessGroup) -> None:
    """Fused messages give the bits of one message per factor; a factor whose
    contributors are a subset is the mean over that subset."""
    dims = [3, 7, 2, 5, 4]
    keys = [(i, "A") for i in range(len(dims))]
    partial = frozenset(range(world_size // 2))
    contributors = [frozenset(range(world_size))] * 3 + [partial] * 2
    results = []
    for plan in ([[0], [1], [2], [3], [4]], [[0, 1, 2], [3, 4]], [[0], [1, 2, 3, 4]]):
        exchange = FactorExchange(
            keys, dims, group=group, contributors=contributors, pipelined=True
        )
        exchange.set_plan(plan)
        for i, dim in enumerate(dims):
            if rank in contributors[i]:
                exchange.submit(keys[i], _factor(rank, i, dim))
        results.append(exchange.finish())
    for other in results[1:]:
        for key in keys:
            assert torch.equal(other[key], results[0][key]), (key, "fused differs from unfused")
    for i, dim in enumerate(dims):
        want = sum(_factor(r, i, dim) for r in sorted(contributors[i])) / len(contributors[i])
        torch.testing.assert_close(results[0][keys[i]], want)


@pytest.mark.timeout(120)
def test_distributed_kfac_at_1_2_and_4_workers_matches_one_process_on_the_global_batch() -> None:
    from api.server import free_port  # here: spawned workers need not import the API

    torch.multiprocessing.spawn(_member, args=(free_port(),), nprocs=max(WORLD_SIZES))
