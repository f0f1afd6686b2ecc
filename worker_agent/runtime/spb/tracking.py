"""Which stage's modules are running during a forward pass.

Forward pre- and post-hooks on every module of each stage keep a stack of stage
indices, so that whatever happens inside a module (a tensor saved for backward, the
clock) can be attributed to its stage, including inside nested submodules. Code the
model runs outside every stage's modules (e.g. adding two embeddings in its own
`forward`) is attributed to None.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from worker_agent.runtime.spb.stages import Stages


class RunningStage:
    """A context manager; `current` is the running stage, `forward_seconds[stage]` the
    time spent in it while the context was active."""

    def __init__(self, stages: Stages) -> None:
        self._stages = stages
        self._stack: list[int] = []
        self._handles: list[RemovableHandle] = []
        self._since = 0.0
        self.forward_seconds: defaultdict[int, float] = defaultdict(float)

    @property
    def current(self) -> int | None:
        return self._stack[-1] if self._stack else None

    def __enter__(self) -> RunningStage:
        for stage, module in enumerate(self._stages.modules):
            for sub in module.modules():
                self._handles.append(sub.register_forward_pre_hook(self._entering(stage)))
                self._handles.append(sub.register_forward_hook(self._leaving))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _entering(self, stage: int) -> Callable[[nn.Module, Any], None]:
        def hook(module: nn.Module, args: Any) -> None:
            self._tick()
            self._stack.append(stage)

        return hook

    def _leaving(self, module: nn.Module, args: Any, output: Any) -> None:
        self._tick()
        self._stack.pop()

    def _tick(self) -> None:
        # The time since the last hook belongs to the stage that was on top meanwhile.
        now = time.perf_counter()
        if self._stack:
            self.forward_seconds[self._stack[-1]] += now - self._since
        self._since = now
