"""Agreement at an iteration boundary: every rank learns rank 0's decision.

One all-reduce of a few float64 slots carries the decision: rank 0 writes it, the other
ranks write zeros, so the sum is rank 0's value (float64 holds integers exactly up to
2**53). The decision's lease tells every rank the next boundary that needs agreeing on;
the boundaries in between need no collective at all. The configuration dict travels
separately, only when its version changes.

The all-reduce is asynchronous: the loop launches it once the step's loss is known and
waits for it after the optimizer step, so it hides behind backward instead of adding a
round trip between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from worker_agent.runtime.protocol import Action, Decision

_ACTIONS = list(Action)
_ACTION, _CONFIG_VERSION, _LEASE_UNTIL, _TARGET_REACHED, _SLOTS = range(5)


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
        self._slots = torch.zeros(_SLOTS, dtype=torch.float64, device=device)
        self._work: dist.Work | None = None
        self._decision: Decision | None = None
        self._config_version = 0
        self._config: dict[str, Any] = dict(config)

    def launch(self, decision: Decision | None, target_reached: bool) -> None:
        """Collective. `decision` and `target_reached` count on rank 0 only."""
        assert self._work is None, "wait() for the previous agreement first"
        slots = self._slots
        slots.zero_()
        if self._rank == 0:
            assert decision is not None, "rank 0 must bring the controller's decision"
            slots[:] = torch.tensor(
                [
                    _ACTIONS.index(decision.action),
                    decision.config_version,
                    decision.lease_until,
                    float(target_reached),
                ],
                dtype=torch.float64,
            )
        self._decision = decision
        self._work = dist.all_reduce(slots, async_op=True)

    def wait(self) -> Agreement:
        assert self._work is not None, "launch() first"
        self._work.wait()
        self._work = None
        action, version, lease_until, reached = self._slots.tolist()
        if int(version) != self._config_version:
            self._follow_config(int(version))
        return Agreement(
            decision=Decision(
                _ACTIONS[int(action)], self._config_version, self._config, int(lease_until)
            ),
            target_reached=bool(reached),
        )

    def agree(self, decision: Decision | None, target_reached: bool) -> Agreement:
        """Collective, synchronous: `launch` then `wait`."""
        self.launch(decision, target_reached)
        return self.wait()

    def _follow_config(self, version: int) -> None:
        payload: list[Any] = [self._decision.config if self._decision is not None else None]
        dist.broadcast_object_list(payload, src=0)
        self._config_version, self._config = version, dict(payload[0])
