"""Reverse first-k trains exactly as DDP does, and applies each layer's update before
that layer's next forward."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from jigsaw import spb
from jigsaw.jobspec import SPBConfig
from tests.ooo_gang import run_on_gang
from tests.ooo_models import CASES
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK

STEPS = 3


def _compare_with_ddp(cases: list[str], first_ks: list[int | None]) -> list[str]:
    """On every rank: train each case with DDP and with reverse first-k on the same
    per-rank batches; return the differences found (empty: none)."""
    problems: list[str] = []
    rank = dist.get_rank()
    for case in cases:
        factory, loss_fn, batch_fn = CASES[case]
        torch.manual_seed(0)
        initial = factory()
        batches = [batch_fn(torch.Generator().manual_seed(10 * rank + i), 4) for i in range(STEPS)]

        ddp = DistributedDataParallel(copy.deepcopy(initial))
        sgd = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        after_step: list[list[torch.Tensor]] = []
        for batch in batches:
            sgd.zero_grad()
            loss_fn(ddp, batch).backward()
            sgd.step()
            after_step.append([p.detach().clone() for p in ddp.module.parameters()])

        for first_k in first_ks:
            problems += _check_reverse_first_k(case, first_k, initial, batches, after_step)
    return problems


def _check_reverse_first_k(
    case: str,
    first_k: int | None,
    initial: torch.nn.Module,
    batches: list[Any],
    after_step: list[list[torch.Tensor]],
) -> list[str]:
    label = f"{case} k={first_k} rank {dist.get_rank()}"
    loss_fn = CASES[case][1]
    model = copy.deepcopy(initial)
    index_of = {id(p): i for i, p in enumerate(model.parameters())}
    schedule = ReverseFirstK(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), first_k
    )
    problems: list[str] = []
    iteration = 0

    def check_forward(module: torch.nn.Module, args: Any) -> None:
        # Registered after the schedule's own hook: what the layer's forward will see.
        layer = next((x for x in schedule.layers if x.module is module), None)
        if layer is None or iteration == 0 or not torch.is_grad_enabled():
            return
        if layer.applied != iteration:
            problems.append(
                f"{label}: layer {layer.index} forward {iteration + 1} ran after "
                f"{layer.applied} updates"
            )
        expected = after_step[iteration - 1]
        for p in layer.params:
            if not torch.allclose(p, expected[index_of[id(p)]], rtol=1e-5, atol=1e-6):
                problems.append(
                    f"{label}: layer {layer.index} forward {iteration + 1} "
                    f"saw parameters other than DDP's after step {iteration}"
                )

    for iteration, batch in enumerate(batches):
        schedule.zero_grad()
        loss = loss_fn(model, batch)
        if iteration == 0:
            for module in model.modules():
                module.register_forward_pre_hook(check_forward)
        schedule.backward(loss)
        schedule.step()
    schedule.flush()
    for p in model.parameters():
        if not torch.allclose(p, after_step[-1][index_of[id(p)]], rtol=1e-5, atol=1e-6):
            problems.append(f"{label}: parameter {index_of[id(p)]} differs from DDP's at the end")
    if len(schedule.layers) < 3:
        problems.append(f"{label}: only {len(schedule.layers)} layers found")
    return problems


@pytest.mark.parametrize(
    ("world_size", "cases"),
    [(2, ["resnet", "tied-custom", "transformer"]), (4, ["tied-custom"])],
)
def test_reverse_first_k_trains_like_ddp_and_updates_each_layer_before_its_forward(
    world_size: int, cases: list[str]
) -> None:
    problems = run_on_gang(world_size, _compare_with_ddp, cases, [None, 2])
    assert problems == []


class _PartialSequential(torch.nn.Sequential):
    """A structured partial backprop worker: no graph, hence no dW, below its depth."""

    def __init__(self, layers: list[torch.nn.Module], depth: int) -> None:
        super().__init__(*layers)
        self.frozen = len(layers) - depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self):
            with torch.set_grad_enabled(index >= self.frozen and torch.is_grad_enabled()):
                x = layer(x)
        return x


def _spb_partial_worker() -> float:
    """Rank 0 trains 3 stages, rank 1 the top 2; returns the largest deviation from SPB's
    semantics: each stage's gradient is the mean over the ranks that train it."""
    depths = spb.worker_depths(SPBConfig(full_fraction=0.5, partial_depth=0.67), 2, 3)
    assert depths == (3, 2)
    stage_contributors = spb.contributors(depths, 3)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 1)]
    reference = torch.nn.Sequential(*copy.deepcopy(layers))
    model = _PartialSequential(copy.deepcopy(layers), depths[dist.get_rank()])
    schedule = ReverseFirstK(model, torch.optim.SGD(model.parameters(), lr=0.1))
    schedule.set_contributors(list(model), stage_contributors)
    batches = {
        rank: [(torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g)) for _ in range(2)]
        for rank in range(2)
        for g in [torch.Generator().manual_seed(rank)]
    }
    for step in range(2):
        x, y = batches[dist.get_rank()][step]
        schedule.backward(F.mse_loss(model(x), y))
        # What SPB means, computed in one process from both ranks' batches.
        grads = []
        for rank in range(2):
            reference.zero_grad()
            F.mse_loss(reference(batches[rank][step][0]), batches[rank][step][1]).backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        with torch.no_grad():
            for index, p in enumerate(reference.parameters()):
                ranks = stage_contributors[index // 2]  # weight and bias per stage
                p -= 0.1 * sum(grads[r][index] for r in ranks) / len(ranks)
    schedule.flush()
    return max(
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )


def test_a_partial_worker_receives_the_contributors_mean_of_the_stages_below_its_cut() -> None:
    assert run_on_gang(2, _spb_partial_worker) < 1e-6
