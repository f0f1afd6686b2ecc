"""The boundary agreement: every rank learns rank 0's decision, riding in the step's
gradient exchange (DDP's first bucket, SPB's world bucket) instead of a collective of
its own. Real gloo process groups on localhost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from jigsaw import spb
from worker_agent.runtime.boundary import BoundarySync, _decode, _encode
from worker_agent.runtime.gang import run_local_gang
from worker_agent.runtime.protocol import Action, Decision
from worker_agent.runtime.spb import stages as stage_cuts
from worker_agent.runtime.spb.partial import PartialBackprop
from worker_agent.runtime.timing import CommMeter, DeviceClock

# Rank 0's decision at boundaries 0, 1, ...: a renewal (the same but for the lease's
# end), every action, growing configuration versions, leases up to the job spec's bound
# on iterations.
DECISIONS = [
    Decision(Action.CONTINUE, 0, {}, 1),
    Decision(Action.CONTINUE, 0, {}, 2),
    Decision(Action.CONTINUE, 3, {}, 255),
    Decision(Action.SUSPEND, 3, {}, 256),
    Decision(Action.STOP, 70_000, {}, 10**12),
    Decision(Action.CONTINUE, 2**31, {}, 123_456_789),
    Decision(Action.CONTINUE, 2**31, {}, 123_456_790, memory_bytes=141 * 10**9),
]
_CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_field_survives_a_buffer_of_a_low_precision_dtype(dtype: torch.dtype) -> None:
    values = {
        "action": 2,
        "target_reached": 1,
        "config_version": 2**31,
        "lease": 10**12,
        "memory": 141 * 10**9,  # an H200's
    }
    digits = torch.tensor(_encode(values), dtype=dtype)
    # What the all-reduce adds on the other ranks: zeros.
    summed = digits + torch.zeros_like(digits) + torch.zeros_like(digits)
    assert _decode(summed.tolist()) == values


def test_a_value_beyond_its_field_is_refused() -> None:
    with pytest.raises(ValueError, match="lease"):
        _encode(
            {"action": 0, "target_reached": 0, "config_version": 0, "lease": 256**6, "memory": 0}
        )


def _count_all_reduces() -> list[int]:
    """Counts torch's all-reduce calls in this process (the hooks call it by module)."""
    calls = [0]
    original = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    dist.all_reduce = counting  # type: ignore[assignment]
    return calls


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=generator), torch.randint(4, (8,), generator=generator)


def _agree_each_step(
    rank: int, sync: BoundarySync, backward: Callable[[int], None], launch: bool = False
) -> tuple[list[tuple[Decision, bool]], list[int]]:
    """Offer each of DECISIONS (rank 0's) around one backward, `launch`ing it as a
    collective of its own or not; what every rank agreed on and how many all-reduces
    each step took."""
    calls = _count_all_reduces()
    agreed, per_step = [], []
    for step, decision in enumerate(DECISIONS):
        before = calls[0]
        sync.offer(step, decision if rank == 0 else None, target_reached=step >= 3)
        if launch:
            sync.launch()
        backward(step)
        agreement = sync.wait()
        per_step.append(calls[0] - before)
        agreed.append((agreement.decision, agreement.target_reached))
    return agreed, per_step


def _ddp_rank(rank: int, world_size: int) -> dict[str, Any]:
    """A DDP model whose first bucket carries the agreement, next to DDP's own
    reduction of the same gradients."""
    sync = BoundarySync(rank, world_size, _CPU, {})
    carrying = DistributedDataParallel(_model())
    carrying.register_comm_hook(CommMeter(DeviceClock(_CPU), world_size, sync), CommMeter.hook)
    plain = DistributedDataParallel(_model())

    def backward(step: int) -> None:
        inputs, targets = _batch(step, rank)
        F.cross_entropy(carrying(inputs), targets).backward()

    agreed, all_reduces = _agree_each_step(rank, sync, backward)
    for step in range(len(DECISIONS)):
        inputs, targets = _batch(step, rank)
        F.cross_entropy(plain(inputs), targets).backward()
    return {
        "agreed": agreed,
        "all_reduces": all_reduces,
        "grads": [p.grad for p in carrying.parameters()],
        "expected": [p.grad for p in plain.parameters()],
    }


def test_the_agreement_rides_in_ddp_first_bucket_and_gradients_are_ddp_means() -> None:
    ranks = run_local_gang(_ddp_rank, 2)
    for result in ranks:
        assert [decision for decision, _ in result["agreed"]] == DECISIONS
        assert [reached for _, reached in result["agreed"]] == [
            s >= 3 for s in range(len(DECISIONS))
        ]
        # One bucket of gradients and no collective of the agreement's own.
        assert result["all_reduces"] == [1] * len(DECISIONS)
        for grad, expected in zip(result["grads"], result["expected"], strict=True):
            torch.testing.assert_close(grad, expected, rtol=0, atol=1e-7)


def _spb_rank(rank: int, world_size: int, carry: bool) -> dict[str, Any]:
    model = _model()
    sync = BoundarySync(rank, world_size, _CPU, {})
    partial = PartialBackprop(
        stage_cuts.build(model, [model], 3),
        model,
        rank=rank,
        world_size=world_size,
        config=spb.resolve({"full_fraction": 0.5, "partial_depth": 0.34}),
        agreement=sync if carry else None,
    )
    wire_bytes = []

    def backward(step: int) -> None:
        partial.begin(step)
        model.zero_grad()
        inputs, targets = _batch(step, rank)
        F.cross_entropy(model(inputs), targets).backward()
        wire_bytes.append(partial.synchronize())

    agreed, collectives = _agree_each_step(rank, sync, backward, launch=not carry)
    return {
        "agreed": agreed,
        "all_reduces": collectives,
        "wire_bytes": wire_bytes,
        "grads": [p.grad for p in model.parameters()],
    }


def test_the_agreement_rides_in_the_spb_world_bucket_without_changing_the_exchange() -> None:
    carried = run_local_gang(_spb_rank, 4, True)
    alone = run_local_gang(_spb_rank, 4, False)
    for with_agreement, without in zip(carried, alone, strict=True):
        assert [decision for decision, _ in with_agreement["agreed"]] == DECISIONS
        # Carrying adds no all-reduce: the agreement that does not ride needs its own.
        assert [n + 1 for n in with_agreement["all_reduces"]] == without["all_reduces"]
        assert with_agreement["wire_bytes"] == without["wire_bytes"]
        # Equal up to the order gloo's ring sums a longer buffer in.
        for grad, expected in zip(with_agreement["grads"], without["grads"], strict=True):
            torch.testing.assert_close(grad, expected, rtol=0, atol=1e-7)
