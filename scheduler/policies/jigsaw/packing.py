"""Step 4, packing: jobs still waiting, in order, join GPUs of running jobs as guests
when that raises the cluster's useful progress (GPU memory never over-committed, no
GPU given more jobs than its agent runs at once: `GPUView.max_jobs`). Only jobs whose
solo utilization is known are guests or hosts: the interference model predicts nothing
without it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jigsaw.jobspec import SPBConfig
from scheduler.core.snapshot import GPUView, JobView
from scheduler.policies.jigsaw.layout import Layout, yields
from scheduler.policies.jigsaw.params import JigsawParams
from scheduler.policies.jigsaw.spb_choice import hosting_config, own_config


def pack(
    ordered: list[JobView],
    base: dict[int, int],
    layout: Layout,
    usable: dict[int, GPUView],
    params: JigsawParams,
    tail: set[int],
) -> list[int]:
    """Place waiting jobs (at their base size) as guests, in order, up to
    `max_guests` tried and until `max_failures` in a row find no place; the guests
    placed. The jobs of `tail` (they will still run when the cluster drains: the last
    of them ends the workload) host only guests of the tail too: what a guest that
    would end sooner anyway costs them comes due at the end, for everyone, while its
    gain is now; beside another job of the tail, the pair ends sooner together than
    one after the other (where the model predicts a gain)."""
    waiting = [
        job
        for job in ordered
        if job.waiting
        and job.id not in layout.jobs
        and job.model is not None
        and job.model.utilization is not None
        and job.workers <= len(usable)
    ]
    rooms = _Rooms(layout, usable, params.configs, tail)
    placed: list[int] = []
    failures = 0
    for job in waiting[: params.max_guests]:
        if _pack_one(rooms, job, base[job.id], params, job.id in tail):
            placed.append(job.id)
            failures = 0
        else:
            failures += 1
            if failures == params.max_failures:
                break  # the rest of the queue is unlikely to fit where these did not
    return placed


@dataclass
class _Rooms:
    """GPUs a guest may join, least loaded first, under the hosts' current
    configurations or with every host alone on its GPU switched to its hosting
    configuration.

    Ranked once per round: a guest scans from the front for GPUs its memory fits on,
    so placing one costs about its own size, not the cluster's.
    """

    layout: Layout
    usable: dict[int, GPUView]
    configs: tuple[SPBConfig, ...]
    tail: set[int]  # jobs that host guests of the tail only
    ranked: dict[bool, list[tuple[float, int, int, int, bool]]] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    def hosting(self) -> dict[int, SPBConfig | None]:
        hosts = {on[0] for g in self.usable if len(on := self.layout.on_gpu.get(g, [])) == 1}
        switched = {
            h: hosting_config(self.layout.jobs[h], self.layout, self.configs) for h in hosts
        }
        return {h: c for h, c in switched.items() if c != self.layout.config[h]}

    def rank(self, switch: bool) -> list[tuple[float, int, int, int, bool]]:
        if switch not in self.ranked:
            layout = self.layout
            changed = self.hosting() if switch else {}
            saved = {h: layout.config[h] for h in changed}
            layout.config.update(changed)
            entries = [
                (0.0, layout.node_of[gpu], gpu, 0, False)
                for gpu in self.usable
                if not layout.on_gpu.get(gpu)
            ]
            entries += self._shared_entries()
            layout.config.update(saved)
            entries.sort()
            self.ranked[switch] = entries
        return self.ranked[switch]

    def _shared_entries(self) -> list[tuple[float, int, int, int, bool]]:
        """(utilization, node, GPU, memory used, whether of the tail) of each usable
        GPU held by jobs of known utilization, fewer than it runs at once; the
        utilization and memory are its holders' together. A job's memory there is what
        it may use, its cap (what the GPU's agent counts) where that is more than the
        model says it needs: a guest beyond the cap's room would be refused."""
        layout = self.layout
        entries = []
        for gpu, view in self.usable.items():
            on = layout.on_gpu.get(gpu)
            if not on or len(on) >= view.max_jobs:
                continue
            utilizations = [u for j in on if (u := layout.utilization(j, gpu)) is not None]
            if len(utilizations) < len(on):
                continue
            used = sum(self._used(job_id, gpu) for job_id in on)
            tail = any(job_id in self.tail for job_id in on)
            entries.append((math.fsum(utilizations), layout.node_of[gpu], gpu, used, tail))
        return entries

    def _used(self, job_id: int, gpu: int) -> int:
        """What the job's worker on `gpu` may take of its memory."""
        layout = self.layout
        shape = layout.shape(job_id)
        assert shape is not None  # its utilization is known
        cap = layout.jobs[job_id].memory_cap_bytes or 0
        return max(shape.worker_memory_bytes[layout.gpus[job_id].index(gpu)], cap)

    def choose(self, size: int, need: int, switch: bool, of_tail: bool) -> tuple[int, ...] | None:
        chosen = []
        memory = self.layout.memory_of
        for _, _, gpu, used, tail in self.rank(switch):
            if gpu in self.taken or used + need > memory[gpu] or (tail and not of_tail):
                continue
            chosen.append(gpu)
            if len(chosen) == size:
                return tuple(chosen)
        return None


def _pack_one(rooms: _Rooms, job: JobView, size: int, params: JigsawParams, of_tail: bool) -> bool:
    """Place `job` as a guest where it adds the most, if it adds at least `min_gain`
    useful GPUs per GPU it takes (beside jobs of the tail only if it is one)."""
    assert job.model is not None
    layout = rooms.layout
    guest = job.model.shape(own_config(job), size, 1)
    need = max(guest.worker_memory_bytes)
    best: tuple[float, tuple[int, ...], dict[int, SPBConfig | None]] | None = None
    for switch in (False, True) if params.spb_enabled else (False,):
        choice = rooms.choose(size, need, switch, of_tail)
        if choice is None:
            continue
        touched = {h for g in choice for h in layout.on_gpu.get(g, ())}
        configs = {}
        if switch:
            if any(len(layout.on_gpu.get(g, ())) > 1 for g in choice):
                continue  # only a host alone on its GPU switches to host
            configs = {
                h: c
                for h in touched
                if (c := hosting_config(layout.jobs[h], layout, params.configs)) != layout.config[h]
            }
            if not configs:
                continue
        gain = _gain(layout, job, choice, configs, params)
        if gain >= params.min_gain * len(choice) and (best is None or gain > best[0]):
            best = (gain, choice, configs)
    if best is None:
        return False
    _, choice, configs = best
    layout.config.update(configs)
    layout.put(job, choice, own_config(job))
    rooms.taken.update(choice)
    return True


def _gain(
    layout: Layout,
    job: JobView,
    choice: tuple[int, ...],
    configs: dict[int, SPBConfig | None],
    params: JigsawParams,
) -> float:
    """Useful GPUs gained by placing `job` on `choice` with these host configurations."""
    hosts = {h for g in choice for h in layout.on_gpu.get(g, ())}
    # A host measured past the yield bound beside its last co-runners would send the
    # guest away at the next boundary: none is packed there until that measurement
    # leaves its recent iterations.
    measured = {h: m for h in hosts if (m := layout.jobs[h].colocated_slowdown) is not None}
    if any(yields(layout.jobs[h], job, m, params.yield_slowdown) for h, m in measured.items()):
        return -math.inf
    # Every job sharing a GPU with a host is affected through the host's pace only.
    before = {h: layout.useful(h) for h in hosts}
    saved = {h: layout.config[h] for h in configs}
    layout.config.update(configs)
    layout.put(job, choice, own_config(job))
    after = {h: layout.useful(h) for h in hosts}
    guest = layout.useful(job.id)
    layout.take(job.id)
    layout.config.update(saved)
    # Hosts are ahead of the guest in the order (shorter, or starving): packing must
    # not cost them more than `max_host_loss` of their progress.
    if any(after[h] < before[h] * (1.0 - params.max_host_loss) for h in hosts):
        return -math.inf
    return guest + sum(after.values()) - sum(before.values())
