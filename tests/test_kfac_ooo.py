"""K-FAC (`optimizer: kfac`) under out-of-order backprop (`backprop: ooo`) takes standard
backprop's K-FAC steps: each layer's G factor once per call from the split backward,
one K-FAC step over every layer once reverse first-k's exchanges are in."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.ooo_gang import run_on_gang
from tests.ooo_models import CASES
from tests.runtime_helpers import run_gang, worker_configs
from tests.test_kfac_training import KFAC_JOB
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.kfac import KFACSGD, KFACSettings
from worker_agent.runtime.kfac.factors import FactorHooks, discover_layers
from worker_agent.runtime.ooo.reverse_first_k import ReverseFirstK
from worker_agent.runtime.ooo.schedules import DeferredWeightBackprop, out_of_order

STEPS = 4  # past the three profiled steps, so fused factor messages are used too
# Factors and decompositions every step, and every other step (capture switched off
# in between: no G may arrive then).
SETTINGS = {
    "every step": KFACSettings(),
    "every 2nd": KFACSettings(factor_update_steps=2, inv_update_steps=2),
}
# tied-custom calls one Linear twice, and a factor message carries whichever call's
# factor it was launched with: with fusion, that depends on the plan each run fits to
# its measured timings, with or without ooo. Unfused, the factors are deterministic.
UNFUSED = {
    name: KFACSettings(
        fusion=False,
        factor_update_steps=settings.factor_update_steps,
        inv_update_steps=settings.inv_update_steps,
    )
    for name, settings in SETTINGS.items()
}
# The damped solve amplifies last-bit differences of the gradient exchange's summation
# order (DDP's buckets against one all-reduce per layer) by the curvature's condition.
RTOL, ATOL = 1e-4, 1e-5


def _kfac(model: nn.Module, settings: KFACSettings) -> KFACSGD:
    return KFACSGD(model, 0.1, settings=settings)


def _train_standard(
    initial: nn.Module, case: str, settings: KFACSettings, batches: list[Any]
) -> list[torch.Tensor]:
    model = copy.deepcopy(initial)
    optimizer = _kfac(model, settings)
    net: nn.Module = DistributedDataParallel(model) if dist.is_initialized() else model
    for batch in batches:
        optimizer.zero_grad()
        CASES[case][1](net, batch).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _train_ooo(
    initial: nn.Module,
    case: str,
    settings: KFACSettings,
    batches: list[Any],
    first_k: int | None,
) -> list[torch.Tensor]:
    model = copy.deepcopy(initial)
    schedule = out_of_order(model, _kfac(model, settings), first_k)
    expected = ReverseFirstK if dist.is_initialized() else DeferredWeightBackprop
    assert isinstance(schedule, expected)
    for batch in batches:
        schedule.zero_grad()
        schedule.backward(CASES[case][1](model, batch))
        schedule.step()
    schedule.flush()
    if isinstance(schedule, ReverseFirstK):
        assert first_k is None or schedule.first_k == first_k < len(schedule.layers)
        assert all(layer.applied == STEPS for layer in schedule.layers)
    return [p.detach().clone() for p in model.parameters()]


def _differences(cases: list[str], first_ks: list[int | None]) -> list[str]:
    """Per case and settings: standard K-FAC (DDP when distributed) against ooo K-FAC on
    the same per-rank batches; the parameters that differ (empty: none)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    problems = []
    for case in cases:
        factory, _, batch_fn = CASES[case]
        torch.manual_seed(0)
        initial = factory()
        batches = [batch_fn(torch.Generator().manual_seed(10 * rank + i), 4) for i in range(STEPS)]
        for name, settings in (UNFUSED if case == "tied-custom" else SETTINGS).items():
            standard = _train_standard(initial, case, settings, batches)
            # K-FAC moved the parameters (a comparison of two no-ops would pass).
            assert any(
                not torch.equal(a, b) for a, b in zip(standard, initial.parameters(), strict=True)
            )
            for first_k in first_ks:
                ooo = _train_ooo(initial, case, settings, batches, first_k)
                for index, (a, b) in enumerate(zip(standard, ooo, strict=True)):
                    if not torch.allclose(a, b, rtol=RTOL, atol=ATOL):
                        error = (a - b).abs().max().item()
                        problems.append(
                            f"{case} {name} k={first_k} rank {rank}: parameter {index} "
                            f"differs by {error:.2e}"
                        )
    return problems


@pytest.mark.parametrize(("world_size", "cases"), [(2, list(CASES)), (4, ["resnet"])])
def test_reverse_first_k_kfac_takes_the_steps_of_ddp_kfac(
    world_size: int, cases: list[str]
) -> None:
    assert run_on_gang(world_size, _differences, cases, [None, 2]) == []


def test_single_process_ooo_kfac_takes_the_steps_of_standard_kfac() -> None:
    assert _differences(list(CASES), [None]) == []


# ---------------------------------------------------------------- G factors, once each


@pytest.mark.parametrize("case", list(CASES))
def test_split_backward_hands_kfac_each_output_gradient_exactly_once(case: str) -> None:
    factory, loss_fn, batch_fn = CASES[case]
    torch.manual_seed(0)
    initial = factory()
    batch = batch_fn(torch.Generator().manual_seed(1), 4)

    def factors(split: bool) -> list[tuple[str, str, torch.Tensor]]:
        model = copy.deepcopy(initial)
        seen: list[tuple[str, str, torch.Tensor]] = []
        hooks = FactorHooks(
            discover_layers(model), lambda layer, kind, f: seen.append((layer.name, kind, f))
        )
        hooks.capturing = True
        optimizer = torch.optim.SGD(model.parameters())
        if split:
            hooks.gradients_from_schedule = True
            schedule = DeferredWeightBackprop(model, optimizer, hooks.output_gradient)
            schedule.backward(loss_fn(model, batch))
        else:
            loss_fn(model, batch).backward()
        return seen

    standard, split = factors(split=False), factors(split=True)
    g_factors = [(name, kind) for name, kind, _ in standard if kind == "G"]
    assert g_factors  # every case has Linear or Conv2d layers
    # The same factors in the same order: each call's G once, none dropped.
    assert [(name, kind) for name, kind, _ in split] == [(n, k) for n, k, _ in standard]
    for (name, kind, a), (_, _, b) in zip(standard, split, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} {kind}")


def test_tensor_hooks_alone_would_count_a_split_backwards_g_twice() -> None:
    """Why the split backward hands G in: a hook on a layer's output runs in the dX
    chain and again when that layer's dW starts from its output (resnet's convolutions
    and head)."""
    factory, loss_fn, batch_fn = CASES["resnet"]
    torch.manual_seed(0)
    initial = factory()
    batch = batch_fn(torch.Generator().manual_seed(1), 4)

    def g_count(split: bool) -> int:
        model = copy.deepcopy(initial)
        kinds: list[str] = []
        hooks = FactorHooks(discover_layers(model), lambda layer, kind, f: kinds.append(kind))
        hooks.capturing = True
        if split:
            schedule = DeferredWeightBackprop(model, torch.optim.SGD(model.parameters()))
            schedule.backward(loss_fn(model, batch))
        else:
            loss_fn(model, batch).backward()
        return kinds.count("G")

    assert g_count(split=True) > g_count(split=False)


# ---------------------------------------------------------------- the training loop

# The K-FAC resume test's job, with an evaluation in the middle (it must see every
# update applied).
_LOOP: dict[str, Any] = {**KFAC_JOB, "max_iterations": 6, "eval_every": 4}


def _run(directory: Path, suspend_at: int | None = None, **fields: Any) -> dict[str, Any]:
    configs = worker_configs(2, checkpoint_dir=directory, **{**_LOOP, **fields})
    controllers = run_gang(configs, [LocalController(suspend_at=suspend_at), LocalController()])
    state: dict[str, Any] = torch.load(directory / CHECKPOINT_FILE, weights_only=True)
    state["evaluations"] = controllers[0].evaluations
    return state


def _assert_same_training(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert actual["iteration"] == expected["iteration"] == _LOOP["max_iterations"]
    assert actual["optimizer"]["kfac"]["steps"] == expected["optimizer"]["kfac"]["steps"]
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(actual["model"][name], tensor, rtol=RTOL, atol=ATOL, msg=name)
    factors = expected["optimizer"]["kfac"]["factors"]
    assert factors.keys() == actual["optimizer"]["kfac"]["factors"].keys()
    for name, factor in factors.items():
        torch.testing.assert_close(
            actual["optimizer"]["kfac"]["factors"][name], factor, rtol=RTOL, atol=ATOL, msg=name
        )


def test_ooo_kfac_job_trains_like_ddp_kfac_and_resumes_on_its_trajectory(tmp_path: Path) -> None:
    standard = _run(tmp_path / "standard")
    ooo = _run(tmp_path / "ooo", backprop="ooo", ooo_first_k=1)
    _assert_same_training(ooo, standard)
    # The evaluation at 4 saw every update of the first four steps.
    assert [at for at, _ in ooo["evaluations"]] == [4, 6]
    for (_, a), (_, b) in zip(standard["evaluations"], ooo["evaluations"], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-4

    interrupted = tmp_path / "interrupted"
    suspended = _run(interrupted, suspend_at=3, backprop="ooo", ooo_first_k=1)
    assert suspended["iteration"] == 3 and suspended["optimizer"]["kfac"]["steps"] == 3
    _assert_same_training(_run(interrupted, backprop="ooo", ooo_first_k=1), ooo)


def test_ooo_kfac_follows_spb_depth_changes_like_spb_kfac(tmp_path: Path) -> None:
    """Partial workers from boundary 2 to 4: rank 1 hands K-FAC no G and no dW of the
    lower stage, K-FAC's factors and reverse first-k's layers are averaged over their
    stage's contributors, and the contributors change between two K-FAC steps."""
    partial = {"full_fraction": 0.5, "partial_depth": 0.5}
    finals = {}
    for backprop in ("standard", "ooo"):
        directory = tmp_path / backprop
        configs = worker_configs(
            2,
            checkpoint_dir=directory,
            spb_enabled=True,
            spb_stages=2,
            backprop=backprop,
            **_LOOP,
        )
        controllers = run_gang(
            configs, [LocalController(reconfigure_at={2: partial, 4: {}}), LocalController()]
        )
        depths = [record.spb_depth for record in controllers[0].records]
        assert depths == [1.0, 1.0, 0.75, 0.75, 1.0, 1.0]
        finals[backprop] = torch.load(directory / CHECKPOINT_FILE, weights_only=True)
    _assert_same_training(finals["ooo"], finals["standard"])
