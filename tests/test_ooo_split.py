"""The dX/dW split and the single-device schedule give the standard schedule's training."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.ooo_models import CASES
from worker_agent.runtime.ooo.schedules import DeferredWeightBackprop
from worker_agent.runtime.ooo.split import GraphCut
from worker_agent.runtime.schedules.base import BackpropSchedule
from worker_agent.runtime.schedules.standard import StandardBackprop

STEPS = 3


def _train(case: str, deferred: bool) -> list[torch.Tensor]:
    factory, loss_fn, batch_fn = CASES[case]
    torch.manual_seed(0)
    model = factory()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule: BackpropSchedule = (
        DeferredWeightBackprop(model, optimizer) if deferred else StandardBackprop(optimizer)
    )
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        schedule.zero_grad()
        schedule.backward(loss_fn(model, batch_fn(generator, 8)))
        schedule.step()
    schedule.flush()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_deferred_weight_gradients_train_like_standard_backprop(case: str) -> None:
    standard, deferred = _train(case, deferred=False), _train(case, deferred=True)
    assert len(standard) == len(deferred)
    for expected, actual in zip(standard, deferred, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    # The parameters moved: equal because trained alike, not because untouched.
    torch.manual_seed(0)
    initial = list(CASES[case][0]().parameters())
    assert any(not torch.equal(a, b) for a, b in zip(initial, deferred, strict=True))


def test_input_pass_computes_no_weight_gradient_and_weight_pass_adds_each_share_once() -> None:
    factory, loss_fn, batch_fn = CASES["tied-custom"]
    torch.manual_seed(0)
    model = factory()
    reference = copy.deepcopy(model)
    batch = batch_fn(torch.Generator().manual_seed(1), 4)
    loss_fn(reference, batch).backward()

    cut = GraphCut(model)
    pieces = cut.collect(loss_fn(model, batch))
    cut.backward_input(pieces)
    assert all(p.grad is None for p in model.parameters())
    # The block runs twice and the tied weight is read by two modules: four pieces use
    # the block or the tied weight, each must add its own share.
    tied = model.embedding.weight
    assert sum(any(w is tied for w in piece.params) for piece in pieces) == 2
    assert sum(piece.module is model.block for piece in pieces) == 2
    for piece in pieces:
        cut.backward_weight(piece)
    for (name, expected), actual in zip(
        reference.named_parameters(), model.parameters(), strict=True
    ):
        assert actual.grad is not None, name
        torch.testing.assert_close(actual.grad, expected.grad, rtol=1e-5, atol=1e-6, msg=name)
