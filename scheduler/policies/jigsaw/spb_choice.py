"""Step 3, SPB choice: each job's configuration where it runs alone, the one a host
takes to make room for guests, and what a job's spec leaves to the policy."""

from __future__ import annotations

from functools import lru_cache

from jigsaw import spb
from jigsaw.jobspec import SPBConfig
from scheduler.core.jobmodel import JobModel, Shape
from scheduler.core.snapshot import JobView
from scheduler.policies.jigsaw.layout import Layout
from scheduler.policies.jigsaw.params import JigsawParams

_CACHED = 1 << 16  # entries per function: the placements of the active jobs


def chooses_spb(job: JobView) -> bool:
    """Whether the policy may choose the job's SPB configuration: only when its spec
    leaves it to the scheduler (`auto`; the simulator's traces carry no setting and are
    all left to it)."""
    return job.spb_setting == "auto"


def own_config(job: JobView) -> SPBConfig | None:
    """The configuration the job runs at unless the policy chooses one: its spec's fixed
    configuration, else off."""
    return spb.resolve(job.spb_setting)


def choose(layout: Layout, kept_guests: set[int], params: JigsawParams) -> None:
    """Each job's best configuration alone (a guest keeps its own; a job whose spec
    fixes its configuration, or turns SPB off, keeps what the spec says). A host
    keeps the configuration its guests were packed under: switched back to full
    backprop, its partial workers would time-slice with the guests and slow it."""
    hosting = {
        host
        for guest in kept_guests
        for gpu in layout.gpus[guest]
        for host in layout.on_gpu[gpu]
        if host not in kept_guests
    }
    for job_id in list(layout.jobs):
        if job_id not in kept_guests and job_id not in hosting:
            job = layout.jobs[job_id]
            chosen = params.spb_enabled and chooses_spb(job)
            layout.config[job_id] = (
                best_alone(job, layout, params.configs) if chosen else own_config(job)
            )


def alone_useful(job: JobView, shape: Shape) -> float:
    """Useful GPUs the job yields alone in `shape`."""
    assert job.model is not None
    return _alone_useful(job.model, job.workers, shape)


def _alone_useful(model: JobModel, workers: int, shape: Shape) -> float:
    return workers * model.alone_step_seconds / (shape.step_seconds * shape.steps_ratio)


def best_alone(job: JobView, layout: Layout, configs: tuple[SPBConfig, ...]) -> SPBConfig | None:
    """Off, or the configuration that yields more useful progress on its own."""
    workers = len(layout.gpus[job.id])
    if job.model is None or job.model.spb_profile is None or workers < 2:
        return None
    nodes = len({layout.node_of[g] for g in layout.gpus[job.id]})
    return _best_alone(job.model, job.workers, workers, nodes, configs)


@lru_cache(maxsize=_CACHED)
def _best_alone(
    model: JobModel, asked: int, workers: int, nodes: int, configs: tuple[SPBConfig, ...]
) -> SPBConfig | None:
    best: SPBConfig | None = None
    best_value = _alone_useful(model, asked, model.shape(None, workers, nodes))
    for config in configs:
        value = _alone_useful(model, asked, model.shape(config, workers, nodes))
        if value > best_value * 1.01:  # not for a rounding error's worth
            best, best_value = config, value
    return best


def hosting_config(
    job: JobView, layout: Layout, configs: tuple[SPBConfig, ...]
) -> SPBConfig | None:
    """The SPB configuration that leaves the most room on its partial workers for a
    guest (the GPU time they leave idle: their compute share times how busy they keep
    the GPU while computing) at the least statistical price. Memory freed is the
    packing step's check."""
    workers = len(layout.gpus[job.id])
    if job.model is None or job.model.spb_profile is None or workers < 2 or not chooses_spb(job):
        return layout.config[job.id]
    nodes = len({layout.node_of[g] for g in layout.gpus[job.id]})
    return _hosting_config(job.model, job.workers, workers, nodes, configs)


@lru_cache(maxsize=_CACHED)
def _hosting_config(
    model: JobModel, asked: int, workers: int, nodes: int, configs: tuple[SPBConfig, ...]
) -> SPBConfig:
    def room(config: SPBConfig) -> float:
        shape = model.shape(config, workers, nodes)
        slack = sum(1.0 - u for u in shape.utilizations or shape.demands)
        return slack * _alone_useful(model, asked, shape)

    return max(configs, key=room)
