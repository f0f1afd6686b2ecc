"""A model cut into ordered stages, and which of them a worker backpropagates through.

Stages come from the trial (`Trial.stages`) or, when the job asks for a number of stages
(`spb.stages`) or the trial declares a single one, are derived from the module tree:
the modules that own parameters, in registration order, cut into consecutive groups of
about equal parameter count.

A worker at depth d trains the top d stages. The stages below its cut must run forward
without recording autograd state. Turning their parameters' `requires_grad` off does
exactly that: an operation none of whose inputs requires grad records no graph node and
saves no tensor, which is what `torch.no_grad()` around those stages would do, without
having to wrap forward calls the trial's model makes itself. The stages sit at the input
side, so nothing below the cut requires grad and the backward pass stops at the cut.
`activations.saved_bytes_by_stage` checks this with `saved_tensors_hooks`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from torch import nn

logger = logging.getLogger(__name__)

# Stages derived for a trial that declares none: enough for the structured family's
# depths (a quarter, a half, three quarters) to differ.
DEFAULT_STAGES = 4


class StageError(ValueError):
    """A model that cannot be cut as asked."""


@dataclass(frozen=True)
class Stages:
    """Stage modules (input side first) and each stage's own parameters.

    A parameter shared by several stages belongs to the topmost one: it is then trained
    by every worker that trains any stage using it, and gets its full gradient there.
    """

    modules: tuple[nn.Module, ...]
    parameters: tuple[tuple[nn.Parameter, ...], ...]

    def __len__(self) -> int:
        return len(self.modules)

    def parameter_bytes(self) -> tuple[int, ...]:
        return tuple(sum(p.numel() * p.element_size() for p in ps) for ps in self.parameters)

    def train_top(self, depth: int) -> None:
        """Make the top `depth` stages trainable and freeze the rest (see the module doc)."""
        count = len(self.modules)
        if not 1 <= depth <= count:
            raise StageError(f"depth {depth} outside 1..{count} stages")
        for stage, params in enumerate(self.parameters):
            trained = stage >= count - depth
            for param in params:
                param.requires_grad_(trained)


def parameter_layers(model: nn.Module) -> list[nn.Module]:
    """Modules that own parameters directly, in registration order: the units a model can
    be cut between."""
    return [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]


def derive(model: nn.Module, count: int) -> list[nn.Module]:
    """`count` stages of consecutive parameter layers, balancing parameter count.

    Each cut is placed where the running parameter count comes closest to its share
    (k/count of the total), keeping at least one layer per stage.
    """
    layers = parameter_layers(model)
    if count < 1:
        raise StageError(f"a model needs at least one stage, got {count}")
    if count > len(layers):
        raise StageError(
            f"cannot cut {type(model).__name__} into {count} stages: it has only "
            f"{len(layers)} layers with parameters"
        )
    sizes = [sum(p.numel() for p in layer.parameters(recurse=False)) for layer in layers]
    total = sum(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    cuts = [0]
    for k in range(1, count):
        # Room for the cuts still to come and for at least one layer after this one.
        low, high = cuts[-1] + 1, len(layers) - (count - k)
        target = total * k / count
        cuts.append(min(range(low, high + 1), key=lambda i: abs(prefix[i] - target)))
    cuts.append(len(layers))
    return [nn.ModuleList(layers[a:b]) for a, b in pairwise(cuts)]


def build(model: nn.Module, declared: Sequence[nn.Module], count: int | None) -> Stages:
    """The stages of `model`: `declared` (the trial's), or derived when `count` is given
    or the trial declares a single stage, which leaves nothing to cut (then into up to
    `DEFAULT_STAGES`)."""
    modules = list(declared)
    if count is not None and count != len(modules):
        modules = derive(model, count)
    elif len(modules) == 1 and (layers := len(parameter_layers(model))) > 1:
        modules = derive(model, min(DEFAULT_STAGES, layers))
    owner: dict[int, int] = {}
    for stage, module in enumerate(modules):
        for param in module.parameters():
            owner[id(param)] = stage  # later (higher) stages overwrite: topmost wins
    loose = [p for p in model.parameters() if id(p) not in owner]
    if loose:
        logger.info(
            "%d parameters of %s are in no declared stage: they join the top stage",
            len(loose),
            type(model).__name__,
        )
        for param in loose:
            owner[id(param)] = len(modules) - 1
    by_stage: list[list[nn.Parameter]] = [[] for _ in modules]
    for param in model.parameters():
        by_stage[owner[id(param)]].append(param)
    return Stages(tuple(modules), tuple(tuple(ps) for ps in by_stage))
