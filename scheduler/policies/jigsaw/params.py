"""JigSaw's tuning: one frozen object with every constant of the policy and its default.

The live cluster builds it from the `JIGSAW_SCHEDULER_JIGSAW_*` settings
(`scheduler.settings.JigsawSettings`), the simulator from its options
(`scheduler.policies.policy_params`); ablations change one field.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from jigsaw.jobspec import SPBConfig
from scheduler.core.interference import Sharing

# The SPB configurations JigSaw chooses from (the simulator's assumed profiles price
# exactly these).
CONFIGS: tuple[SPBConfig, ...] = (
    SPBConfig(full_fraction=0.5, partial_depth=0.5),
    SPBConfig(full_fraction=0.5, partial_depth=0.25),
    SPBConfig(full_fraction=0.25, partial_depth=0.5),
)

_Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class JigsawParams(BaseModel):
    """The policy's constants (`scheduler.policies.jigsaw` says where each acts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sharing: Sharing = Field(
        default=Sharing.TIME_SLICING,
        description="How co-located jobs share a GPU (time-slicing or mps): picks the "
        "measured interference fit of each GPU's generation (`scheduler.core.interference`).",
    )
    starvation_seconds: float = Field(
        default=12 * 3600.0,
        ge=0.0,
        description="A job that has waited this long in all goes ahead and keeps its place.",
    )
    stickiness: float = Field(
        default=0.7,
        gt=0.0,
        description="Factor on a running job's remaining GPU-time in the order, so that a "
        "small difference never pays a restart.",
    )
    min_gain: float = Field(
        default=0.1,
        description="Useful GPUs a guest must add, per GPU it takes, net of its hosts' loss.",
    )
    max_guests: int = Field(default=64, ge=0, description="Guests tried per round (0: no packing).")
    max_failures: int = Field(
        default=8,
        ge=1,
        description="Guests in a row that find no place before packing stops for the round.",
    )
    max_host_loss: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Most of its progress a host may lose to a guest (co-runners that "
        "gain together still slow each other: 5-30% measured on an H100).",
    )
    yield_slowdown: float = Field(
        default=1.15,
        ge=1.0,
        description="A guest yields at the next lease boundary when a host's iteration "
        "takes more than this many times as long as with its GPUs to itself: measured on "
        "the cluster where the host has run beside co-runners, else predicted (above "
        "1 / (1 - max_host_loss), so that a guest is not packed only to yield).",
    )
    efficiency_floors: tuple[_Fraction, ...] = Field(
        default=(0.3, 0.7, 0.8),
        description="Shrink floors: when requests do not fit, jobs run on the most GPUs "
        "they use at no less than one of these fractions of their best progress per GPU, "
        "the one predicted to end them soonest on average (ties: the first; empty: never "
        "shrink). A low floor to run bursts one after another wide, high ones to run "
        "them at once narrow; sizes between, growth reaches.",
    )
    long_job_seconds: float = Field(
        default=7200.0,
        ge=0.0,
        description="A job with more than this to go is sized at `long_job_floor`.",
    )
    long_job_floor: float = Field(
        default=0.95, ge=0.0, le=1.0, description="The shrink floor of long jobs."
    )
    min_grow_saving: float = Field(
        default=600.0,
        ge=0.0,
        description="Seconds growing must save a running job ...",
    )
    min_grow_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="... or this share of its time to go, whichever is less (a job near "
        "its end gains in proportion to what it has left); never less than the move costs "
        "it (`JobView.resize_seconds`: its measured resizes on the cluster, the restart in "
        "the simulator).",
    )
    grow_floor: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        description="In the first growth pass a long job grows only to sizes at this "
        "fraction of its best progress per GPU.",
    )
    grow_floor_seconds: float = Field(
        default=4 * 3600.0,
        ge=0.0,
        description="What a job must have to go for `grow_floor` to hold it back.",
    )
    straggler_drain: float = Field(
        default=1.0,
        ge=0.0,
        description="A job needing this share of the cluster's drain time even at its "
        "fastest size is ordered at `straggler_discount` of its GPU-time (0: never).",
    )
    straggler_discount: float = Field(
        default=0.25,
        ge=0.0,
        description="Factor on a makespan-setting job's GPU-time in the order.",
    )
    tail_share: float = Field(
        default=0.45,
        ge=0.0,
        description="Jobs needing this share of the drain time even at their fastest size "
        "grow longest first in the first pass and host no guest (0: none such).",
    )
    pace_after_seconds: float = Field(
        default=3 * 3600.0,
        ge=0.0,
        description="Once no job has been submitted for this long, the jobs that would "
        "set the makespan are paced (inf: never). Pacing trades the jobs' mean JCT for "
        "the makespan: sooner, a batch ends sooner and its users wait longer, and a "
        "cluster whose arrivals stop pays it in mean JCT.",
    )
    pace_slack: float = Field(
        default=0.2,
        ge=0.0,
        description="Paced jobs are paced to finish by the least makespan of all known "
        "work times 1 + this (0: by the bound itself, which holds the most GPUs).",
    )
    rebatch_gain: float = Field(
        default=0.1,
        ge=0.0,
        description="A running adaptive job changes its global batch where it runs (at "
        "its next boundary, in place) once the batch with the most goodput there makes "
        "this much more than its own (0.1: 10%); 0: only when it is resized.",
    )
    fluid_load: float = Field(
        default=3.0,
        ge=0.0,
        description="While what the jobs ask for is at most this many times the GPUs, "
        "adaptive jobs may be sized by the fluid sum (`fluid`) instead of the shrink "
        "floor, where that ends the jobs no later on average (0: never).",
    )
    fluid_exponent: float = Field(
        default=0.5,
        gt=0.0,
        description="The exponent on each job's completion rate in the fluid sum: 1 "
        "races the shortest job, lower spreads GPUs over the jobs.",
    )
    fluid_margin_seconds: float = Field(
        default=90.0,
        ge=0.0,
        description="Seconds the fluid sum adds to a job's time at a size other than "
        "what it holds, beyond what the move costs it, so that it moves for a clear gain.",
    )
    fluid_max_cells: int = Field(
        default=10_000_000,
        ge=0,
        description="Most jobs x GPUs for which the fluid sum is solved exactly (its "
        "program's cost grows with both: 1 s measured for 3,000 jobs on 8,192 GPUs); "
        "above, by its Lagrangian relaxation (`scheduler.core.shares.relax`).",
    )
    configs: tuple[SPBConfig, ...] = Field(
        default=CONFIGS, min_length=1, description="The SPB configurations JigSaw chooses from."
    )
    grow: bool = Field(default=True, description="Grow placed jobs into idle GPUs.")
    spb_enabled: bool = Field(
        default=True, description="Choose SPB configurations for jobs that leave it to JigSaw."
    )
