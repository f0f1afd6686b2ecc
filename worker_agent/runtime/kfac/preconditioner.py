"""Distributed K-FAC: factors from hooks, exchanged while the pass runs, decomposed where
the placement says, and applied to the (already averaged) gradients before the update.

`KFACPreconditioner.step(learning_rate)` runs between backward and the optimizer's step;
`KFACSGD` is SGD with momentum that calls it, which is how the runtime offers
`optimizer: kfac` without changing its loop or checkpoint format.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from worker_agent.runtime.kfac.exchange import (
    FactorExchange,
    FactorKey,
    broadcast_collective,
    fusion_plan,
    gather_collective,
    measure_comm_model,
)
from worker_agent.runtime.kfac.factors import FactorHooks, KFACLayer, discover_layers
from worker_agent.runtime.kfac.placement import (
    Placement,
    balanced,
    broadcast_seconds,
    measure_inversion_seconds,
    round_robin,
)
from worker_agent.runtime.kfac.precondition import (
    Decomposition,
    Method,
    decompose,
    kl_clip_scale,
    precondition,
    tikhonov_pi,
)

logger = logging.getLogger(__name__)

PlacementRule = Literal["balanced", "round-robin"]


@dataclass(frozen=True)
class KFACSettings:
    damping: float = 3e-3
    factor_decay: float = 0.95  # running average: F <- decay F + (1 - decay) F_new
    factor_update_steps: int = 1
    inv_update_steps: int = 1
    kl_clip: float = 1e-3
    method: Method = "eigen"
    # Start each factor's exchange from its hook (else: all after backward).
    pipelined: bool = True
    # Merge factors into messages by the profiled plan (else: one message per factor).
    fusion: bool = True
    placement: PlacementRule = "balanced"
    # Factor-update steps profiled (unfused) before the fusion plan is fitted.
    profile_steps: int = 3

    def __post_init__(self) -> None:
        if self.fusion and not self.pipelined:
            raise ValueError("K-FAC tensor fusion needs the pipelined exchange")
        for name in ("factor_update_steps", "inv_update_steps", "profile_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"K-FAC {name} must be at least 1")
        if not 0 <= self.factor_decay < 1 or self.damping <= 0 or self.kl_clip <= 0:
            raise ValueError("K-FAC needs 0 <= factor_decay < 1, damping > 0 and kl_clip > 0")


NAIVE = KFACSettings(pipelined=False, fusion=False, placement="round-robin")


@dataclass
class StepTimes:
    """Where the last K-FAC step's time went (seconds, this worker's wall clock)."""

    factor_compute: float = 0.0  # in the hooks, computing A and G
    factor_exchange: float = 0.0  # blocked waiting for factor messages after backward
    inversion: float = 0.0  # decomposing factors
    broadcast: float = 0.0  # blocked waiting for other workers' decompositions
    apply: float = 0.0  # preconditioning the gradients

    def add(self, other: StepTimes) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Curvature:
    factors: dict[FactorKey, torch.Tensor] = field(default_factory=dict)
    decompositions: dict[FactorKey, Decomposition] = field(default_factory=dict)


class KFACPreconditioner:
    def __init__(
        self,
        model: nn.Module,
        settings: KFACSettings = KFACSettings(),
        *,
        group: ProcessGroup | None = None,
        contributors: Mapping[str, frozenset[int]] | None = None,
    ) -> None:
        self.settings = settings
        self.layers: list[KFACLayer] = discover_layers(model)
        self._group = group
        self._distributed = dist.is_initialized() and dist.get_world_size(group) > 1
        self._world_size = dist.get_world_size(group) if self._distributed else 1
        self._rank = dist.get_rank(group) if self._distributed else 0
        self._device = next(model.parameters()).device
        # Production order: A in forward order, then G as backward reaches the layers.
        count = len(self.layers)
        self._keys: list[FactorKey] = [(i, "A") for i in range(count)]
        self._keys += [(i, "G") for i in reversed(range(count))]
        dims = [self._dim(key) for key in self._keys]
        self.exchange = FactorExchange(
            self._keys,
            dims,
            group=group,
            contributors=[frozenset()] * len(self._keys),
            pipelined=settings.pipelined,
        )
        self.set_contributors(contributors)
        self._curvature = _Curvature()
        self.steps = 0
        self._profiled: list[list[float]] = []
        self._placement: Placement | None = None
        self._decomposed_at: int | None = None
        self._prepared = False  # `prepare` ran for the coming step
        self.times = StepTimes()
        self._hooks = FactorHooks(self.layers, self._on_factor)
        self._hooks.capturing = True

    @property
    def placement(self) -> Placement | None:
        """Who decomposes which factor (None before the first decomposition)."""
        return self._placement

    def set_contributors(self, contributors: Mapping[str, frozenset[int]] | None) -> None:
        """Per layer name, the workers whose factors count (default: every worker).

        Structured partial backprop: a worker that does not backpropagate a layer's
        stage has no G for it, and its A would describe samples the layer's averaged
        gradient does not contain; both factors are averaged over the contributors.
        """
        everyone = frozenset(range(self._world_size))
        self.exchange.contributors = [
            contributors.get(self.layers[i].name, everyone) if contributors else everyone
            for i, _ in self._keys
        ]

    def _dim(self, key: FactorKey) -> int:
        layer = self.layers[key[0]]
        return layer.a_dim if key[1] == "A" else layer.g_dim

    def _on_factor(self, layer: KFACLayer, kind: str, factor: torch.Tensor) -> None:
        start = time.perf_counter()
        self.exchange.submit((self.layers.index(layer), kind), factor)
        self.times.factor_compute += time.perf_counter() - start

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self.times, name, getattr(self.times, name) + time.perf_counter() - start)

    def output_gradients_from_schedule(
        self,
    ) -> Callable[[nn.Module, list[torch.Tensor | None]], None]:
        """For a backward split into dX and dW (`backprop: ooo`): from now on G comes
        from the returned function, which the schedule calls once per layer call with
        that call's final output gradient, instead of from tensor hooks."""
        self._hooks.gradients_from_schedule = True
        return self._hooks.output_gradient

    @torch.no_grad()
    def prepare(self) -> None:
        """The part of the step that needs no gradient: the factors' exchange, their
        running averages and the decompositions. Collective when distributed; `step`
        runs it unless it ran since the last step, so that a schedule can run it while
        the gradients are still being exchanged."""
        if self._prepared:
            return
        if self._hooks.capturing:
            with self._timed("factor_exchange"):
                averaged = self.exchange.finish()
            self._update_factors(averaged)
        if self._curvature.factors and (
            self._decomposed_at is None or self.steps % self.settings.inv_update_steps == 0
        ):
            self._decompose()
        self._prepared = True

    @torch.no_grad()
    def step(self, learning_rate: float) -> None:
        """Precondition every K-FAC layer's gradient in place; collective when distributed."""
        self.prepare()
        if self._curvature.decompositions:
            with self._timed("apply"):
                self._apply(learning_rate)
        self.steps += 1
        self._prepared = False
        self._hooks.capturing = self.steps % self.settings.factor_update_steps == 0
        if self._hooks.capturing:
            self.exchange.begin()

    def _update_factors(self, averaged: dict[FactorKey, torch.Tensor]) -> None:
        decay = self.settings.factor_decay
        for key, new in averaged.items():
            old = self._curvature.factors.get(key)
            # The first factors replace nothing: an average with zeros would
            # understate the curvature for the first 1 / (1 - decay) updates.
            self._curvature.factors[key] = new if old is None else decay * old + (1 - decay) * new
        # Profiled from this process's first factor steps (a resumed run profiles again).
        if (
            self._distributed
            and self.settings.fusion
            and len(self._profiled) < self.settings.profile_steps
        ):
            self._profiled.append(list(self.exchange.ready_seconds))
            if len(self._profiled) == self.settings.profile_steps:
                self._fit_fusion_plan()

    def _fit_fusion_plan(self) -> None:
        ready = torch.tensor(self._profiled, dtype=torch.float64, device=self._device).mean(dim=0)
        # Every worker must fuse identically: the slowest worker's ready times count.
        dist.all_reduce(ready, op=dist.ReduceOp.MAX, group=self._group)
        model = measure_comm_model(self._group, gather_collective, self._device)
        plan = fusion_plan(ready.tolist(), self.exchange.elements, model)
        self.exchange.set_plan(plan)
        logger.info(
            "K-FAC fusion: %d factors in %d messages (alpha %.1f us, beta %.3f ns/element)",
            len(self._keys),
            len(plan),
            model.alpha * 1e6,
            model.beta * 1e9,
        )

    def _place(self) -> Placement:
        dims = [self._dim(key) for key in self._keys]
        method = self.settings.method
        if self.settings.placement == "round-robin":
            return round_robin(len(dims), self._world_size)
        seconds = measure_inversion_seconds(dims, method, self._group, self._device)
        model = measure_comm_model(self._group, broadcast_collective, self._device)
        inversion = [seconds[d] for d in dims]
        placement = balanced(inversion, broadcast_seconds(dims, method, model), self._world_size)
        logger.info(
            "K-FAC placement: %d of %d factors decomposed locally by every worker",
            placement.owners.count(None),
            len(dims),
        )
        return placement

    def _decompose(self) -> None:
        if self._placement is None:
            self._placement = (
                self._place() if self._distributed else Placement((None,) * len(self._keys))
            )
        damping = self._factor_damping()
        pending: list[tuple[FactorKey, torch.Tensor, dist.Work]] = []
        decompositions: dict[FactorKey, Decomposition] = {}
        method = self.settings.method
        # Owned factors first and broadcast at once (others wait on them); local ones
        # are computed while those broadcasts travel. Every worker issues the
        # broadcasts in the same (factor) order.
        for key, owner in zip(self._keys, self._placement.owners, strict=True):
            if owner is None:
                continue
            if owner == self._rank:
                with self._timed("inversion"):
                    decompositions[key] = decompose(
                        self._curvature.factors[key], method, damping[key]
                    )
                buffer = decompositions[key].flat()
            else:
                elements = Decomposition.elements(self._dim(key), method)
                factor = self._curvature.factors[key]
                buffer = factor.new_empty(elements)
            source = dist.get_global_rank(self._group, owner) if self._group else owner
            work = dist.broadcast(buffer, src=source, group=self._group, async_op=True)
            pending.append((key, buffer, work))
        with self._timed("inversion"):
            for key, owner in zip(self._keys, self._placement.owners, strict=True):
                if owner is None:
                    decompositions[key] = decompose(
                        self._curvature.factors[key], method, damping[key]
                    )
        with self._timed("broadcast"):
            for key, buffer, work in pending:
                work.wait()
                if key not in decompositions:
                    decompositions[key] = Decomposition.from_flat(buffer, self._dim(key), method)
        self._curvature.decompositions = decompositions
        self._decomposed_at = self.steps

    def _factor_damping(self) -> dict[FactorKey, float]:
        """Each factor's share of the damping for the inverse method (unused by eigen)."""
        root = self.settings.damping**0.5
        shares: dict[FactorKey, float] = {}
        for i in range(len(self.layers)):
            pi = tikhonov_pi(self._curvature.factors[(i, "A")], self._curvature.factors[(i, "G")])
            shares[(i, "A")], shares[(i, "G")] = root * pi, root / pi
        return shares

    def _apply(self, learning_rate: float) -> None:
        # The eigen method adds the whole damping to the Kronecker eigenvalues; the
        # inverse method has already split it between the two factors.
        damping = self.settings.damping if self.settings.method == "eigen" else 0.0
        pairs = []
        for i, layer in enumerate(self.layers):
            if layer.module.weight.grad is None:
                continue  # not trained this step (e.g. below this worker's SPB cut)
            grad = layer.gradient_matrix()
            decomps = self._curvature.decompositions
            update = precondition(grad, decomps[(i, "A")], decomps[(i, "G")], damping)
            pairs.append((layer, update, grad))
        scale = kl_clip_scale([(v, g) for _, v, g in pairs], learning_rate, self.settings.kl_clip)
        for layer, update, _ in pairs:
            layer.set_gradient_matrix(update * scale)

    def state_dict(self) -> dict[str, Any]:
        """Running factors, decompositions in use and counters: a resumed run continues
        the same trajectory (placement and fusion plan are re-measured; they change
        where work runs, not its values)."""
        names = [layer.name for layer in self.layers]
        return {
            "steps": self.steps,
            "decomposed_at": self._decomposed_at,
            "factors": {
                f"{names[i]}/{kind}": tensor.cpu()
                for (i, kind), tensor in self._curvature.factors.items()
            },
            "decompositions": {
                f"{names[i]}/{kind}": {"matrix": d.matrix.cpu(), "values": d.values}
                for (i, kind), d in self._curvature.decompositions.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        indices = {layer.name: i for i, layer in enumerate(self.layers)}

        def key(name: str) -> FactorKey:
            layer_name, kind = name.rsplit("/", 1)
            if layer_name not in indices:
                raise ValueError(f"K-FAC state holds an unknown layer {layer_name!r}")
            return indices[layer_name], kind

        device = self._device
        self._curvature = _Curvature(
            {key(name): t.to(device) for name, t in state["factors"].items()},
            {
                key(name): Decomposition(
                    d["matrix"].to(device), None if d["values"] is None else d["values"].to(device)
                )
                for name, d in state["decompositions"].items()
            },
        )
        self.steps = int(state["steps"])
        self._decomposed_at = state["decomposed_at"]
        self._prepared = False
        self._hooks.capturing = self.steps % self.settings.factor_update_steps == 0
        self.exchange.begin()

    def remove_hooks(self) -> None:
        self._hooks.remove()


class KFACSGD(torch.optim.SGD):
    """SGD with momentum on K-FAC-preconditioned gradients; its state holds K-FAC's."""

    def __init__(
        self,
        model: nn.Module,
        learning_rate: float,
        *,
        momentum: float = 0.9,
        settings: KFACSettings = KFACSettings(),
        group: ProcessGroup | None = None,
        contributors: Mapping[str, frozenset[int]] | None = None,
    ) -> None:
        super().__init__(model.parameters(), lr=learning_rate, momentum=momentum)
        if group is None and dist.is_initialized() and dist.get_world_size() > 1:
            # Its own communicator: factor messages start from hooks in the middle of
            # backward, independently of DDP's buckets and the loop's agreements.
            group = dist.new_group()
        self.preconditioner = KFACPreconditioner(
            model, settings, group=group, contributors=contributors
        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        self.preconditioner.step(self.param_groups[0]["lr"])
        return super().step(closure)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["kfac"] = self.preconditioner.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self.preconditioner.load_state_dict(state.pop("kfac"))
        super().load_state_dict(state)
