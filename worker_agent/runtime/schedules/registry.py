"""Which backward schedule a worker runs, from its configuration (the job's spec)."""

from __future__ import annotations

from collections.abc import Callable

from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.schedules.base import Parts, Schedule
from worker_agent.runtime.schedules.elastic import ElasticDataParallel
from worker_agent.runtime.schedules.ooo import DeferredWeightSchedule, ReverseFirstKSchedule
from worker_agent.runtime.schedules.pipeline import PipelineParallel
from worker_agent.runtime.schedules.spb import PartialBackpropExchange
from worker_agent.runtime.schedules.standard import DataParallel

SCHEDULES: dict[str, Callable[[Parts], Schedule]] = {
    "standard": DataParallel,
    "elastic": ElasticDataParallel,
    "spb": PartialBackpropExchange,
    "ooo": ReverseFirstKSchedule,
    "ooo-single-device": DeferredWeightSchedule,
    "pipeline": PipelineParallel,
}


def schedule_key(config: WorkerConfig) -> str:
    """A pipeline trains pipeline parallel (the spec allows no SPB and no ooo with it);
    `backprop: ooo` replaces DDP and SPB's exchange (SPB's cut still decides what each
    rank trains); SPB's exchange replaces DDP for a job that may run SPB; an elastic or
    adaptive-batch job (the spec allows it only with none of those) splits its batch
    into accumulated micro-batches."""
    if config.pipeline is not None:
        return "pipeline"
    if config.backprop == "ooo":
        return "ooo" if config.world_size > 1 else "ooo-single-device"
    if config.spb_enabled:
        return "spb"
    if config.max_micro_batch is not None:
        return "elastic"
    return "standard"


def build(parts: Parts) -> Schedule:
    """The schedule of `parts.config`: collective (every rank builds the same one)."""
    return SCHEDULES[schedule_key(parts.config)](parts)
