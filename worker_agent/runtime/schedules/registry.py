"""Which backward schedule a worker runs, from its configuration (the job's spec)."""

from __future__ import annotations

from collections.abc import Callable

from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.schedules.base import Parts, Schedule
from worker_agent.runtime.schedules.ooo import DeferredWeightSchedule, ReverseFirstKSchedule
from worker_agent.runtime.schedules.pipeline import PipelineParallel
from worker_agent.runtime.schedules.spb import PartialBackpropExchange
from worker_agent.runtime.schedules.standard import DataParallel

SCHEDULES: dict[str, Callable[[Parts], Schedule]] = {
    "standard": DataParallel,
    "spb": PartialBackpropExchange,
    "ooo": ReverseFirstKSchedule,
    "ooo-single-device": DeferredWeightSchedule,
    "pipeline": PipelineParallel,
}


def schedule_key(config: WorkerConfig) -> str:
    """A pipeline trains pipeline parallel (the spec allows no SPB and no ooo with it);
    `backprop: ooo` replaces DDP and SPB's exchange (SPB's cut still decides what each
    rank trains); SPB's exchange replaces DDP for a job that may run SPB."""
    if config.pipeline is not None:
        return "pipeline"
    if config.backprop == "ooo":
        return "ooo" if config.world_size > 1 else "ooo-single-device"
    if config.spb_enabled:
        return "spb"
    return "standard"


def build(parts: Parts) -> Schedule:
    """The schedule of `parts.config`: collective (every rank builds the same one)."""
    return SCHEDULES[schedule_key(parts.config)](parts)
