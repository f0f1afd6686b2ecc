"""Agreement at an iteration boundary: every rank learns rank 0's decision.

The decision travels as a few numbers in an all-reduce: rank 0 writes it, the other
ranks write zeros, so the sum is rank 0's value. Every number is written as base-256
digits, which any floating dtype holds exactly (bfloat16 included), so the agreement
can ride in a gradient buffer of whatever dtype the model trains in. The decision's lease
tells every rank the next boundary that needs agreeing on; the boundaries in between
need no collective at all. The configuration dict travels separately, only when its
version changes.

An agreement costs no collective of its own when the step's gradient exchange carries
it: the loop `offer`s it before backward, and the exchange's first all-reduce over the
whole world (DDP's first bucket, SPB's all-contributor bucket) appends the digits to its
buffer (`board`) and takes them off the reduced buffer (`alight`). On gloo a separate
all-reduce per step made a small model's step 29-50% slower, riding 2-4%
(`benchmarks/runtime_overhead.py`, part 2). Schedules without such an all-reduce `launch` the
agreement as a collective of its own, asynchronously, so that it hides behind backward.
Whether the digits ride is decided identically on every rank (same lease, same bucket
order), so the collectives always match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from worker_agent.runtime.protocol import Action, Decision

_ACTIONS = list(Action)
_BASE = 256
# Digits per field, enough for the job spec's bounds (max_iterations <= 10**12 bounds
# a lease's length) and a memory cap in bytes (256**6: 281 TB).
_FIELDS = {"action": 1, "target_reached": 1, "config_version": 4, "lease": 6, "memory": 6}
_DIGITS = sum(_FIELDS.values())


def _encode(values: dict[str, int]) -> list[float]:
    digits: list[float] = []
    for name, width in _FIELDS.items():
        value = values[name]
        if not 0 <= value < _BASE**width:
            raise ValueError(f"{name} {value} does not fit the boundary agreement")
        digits.extend(float((value // _BASE**place) % _BASE) for place in range(width))
    return digits


def _decode(digits: list[float]) -> dict[str, int]:
    values: dict[str, int] = {}
    at = 0
    for name, width in _FIELDS.items():
        values[name] = sum(
            round(digit) * _BASE**place for place, digit in enumerate(digits[at : at + width])
        )
        at += width
    return values


@dataclass(frozen=True)
class Agreement:
    decision: Decision
    target_reached: bool  # rank 0's last evaluation met the job's target metric


class BoundarySync:
    def __init__(
        self, rank: int, world_size: int, device: torch.device, config: dict[str, Any]
    ) -> None:
        """`config` is the launch's configuration, version 0 on every rank."""
        self._rank = rank
        self._world_size = world_size
        self._slots = torch.zeros(_DIGITS, dtype=torch.float64, device=device)
        self._offered = False
        self._boarded = False
        self._work: dist.Work | None = None
        self._decision: Decision | None = None
        self._boundary = 0
        # What rank 0 last wrote, and the last digits decoded: renewals repeat them.
        self._offered_fields: tuple[int, ...] = ()
        self._agreed_digits: list[float] = []
        self._agreed: dict[str, int] = {}
        self._config_version = 0
        self._config: dict[str, Any] = dict(config)

    def offer(self, boundary: int, decision: Decision | None, target_reached: bool) -> None:
        """Set the agreement at `boundary` up for `launch` or a carrier's `board`.
        `decision` and `target_reached` count on rank 0 only."""
        assert not self._offered, "wait() for the previous agreement first"
        self._boundary = boundary
        if self._rank == 0:
            assert decision is not None, "rank 0 must bring the controller's decision"
            # The lease travels as its length, so that a decision renewed at every
            # boundary encodes the same each time: rank 0's slots, which the sum left
            # holding its own digits, are then already written.
            fields = (
                _ACTIONS.index(decision.action),
                int(target_reached),
                decision.config_version,
                max(decision.lease_until - boundary, 0),
                decision.memory_bytes,
            )
            if fields != self._offered_fields:
                digits = _encode(dict(zip(_FIELDS, fields, strict=True)))
                self._slots.copy_(torch.tensor(digits, dtype=torch.float64))
                self._offered_fields = fields
        else:
            self._slots.zero_()
        self._decision = decision
        self._offered = True

    def launch(self) -> None:
        """Collective: the offered agreement's own all-reduce, asynchronous."""
        assert self._offered and not self._boarded and self._work is None
        if self._world_size > 1:
            self._work = dist.all_reduce(self._slots, async_op=True)

    def board(self, dtype: torch.dtype) -> torch.Tensor | None:
        """For a carrier about to all-reduce a flat buffer of `dtype` over the whole
        world: the offered agreement, to append to the buffer, or None when none waits
        to ride. The carrier must hand the reduced buffer to `alight`."""
        if not self._offered or self._boarded or self._work is not None:
            return None
        self._boarded = True
        return self._slots.to(dtype)

    def alight(self, reduced: torch.Tensor) -> torch.Tensor:
        """The reduced buffer without the agreement, which this keeps (a view, no copy)."""
        self._slots.copy_(reduced[-_DIGITS:])
        return reduced[:-_DIGITS]

    def wait(self) -> Agreement:
        """Collective when the offered agreement neither launched nor rode (a carrier
        that had nothing to all-reduce this step): it is reduced here, in the open."""
        assert self._offered, "offer() first"
        if self._work is not None:
            self._work.wait()
        elif not self._boarded and self._world_size > 1:
            dist.all_reduce(self._slots)
        self._offered = self._boarded = False
        self._work = None
        digits = self._slots.tolist()
        if digits != self._agreed_digits:
            self._agreed_digits, self._agreed = digits, _decode(digits)
        values = self._agreed
        if values["config_version"] != self._config_version:
            self._follow_config(values["config_version"])
        return Agreement(
            decision=Decision(
                _ACTIONS[values["action"]],
                self._config_version,
                self._config,
                self._boundary + values["lease"],
                values["memory"],
            ),
            target_reached=bool(values["target_reached"]),
        )

    def agree(self, boundary: int, decision: Decision | None, target_reached: bool) -> Agreement:
        """Collective, synchronous: `offer`, `launch` and `wait`."""
        self.offer(boundary, decision, target_reached)
        self.launch()
        return self.wait()

    def _follow_config(self, version: int) -> None:
        payload: list[Any] = [self._decision.config if self._decision is not None else None]
        if self._world_size > 1:
            dist.broadcast_object_list(payload, src=0)
        self._config_version, self._config = version, dict(payload[0])
