"""Co-location on one agent: several jobs' real worker processes on one virtual GPU slot,
each under its memory cap, the slot's room checked at launch, and what each job reports
about its neighbours (no mocks: the supervisor, its workers and their gloo groups)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from jigsaw.gpus import GpuSlot
from jigsaw.proto.v2 import agent_pb2
from tests.test_agent_supervisor import _launch, _next, _start, _until, _until_exit
from worker_agent.gpus import VIRTUAL_KIND
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.supervisor import Supervisor
from worker_agent.wire import Outbound

GIB = 1 << 30
_SLOT_MEMORY = 8 * GIB


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    """Two virtual slots of 8 GiB with two threads each; up to three jobs a slot."""
    slots = [GpuSlot(index, VIRTUAL_KIND, _SLOT_MEMORY, virtual=True) for index in (0, 1)]
    supervisor = Supervisor(
        slots, tmp_path / "agent", torch_threads=2, stop_grace_seconds=5, max_jobs_per_gpu=3
    )
    yield supervisor
    supervisor.close()


def _job(
    job_id: int, gpu: int, checkpoints: Path | None = None, **fields: Any
) -> agent_pb2.LaunchCommand:
    """A one-rank job on `gpu`, with a 2 GiB cap unless told otherwise."""
    fields.setdefault("memory_bytes", 2 * GIB)
    if checkpoints is not None:
        fields["checkpoint_dir"] = str(checkpoints)
    return _launch(job_id, ranks=((0, gpu),), **fields)


def _exits(supervisor: Supervisor, jobs: set[int]) -> tuple[list[Outbound], dict[int, Any]]:
    """Every message until all of `jobs` have exited, and their exits."""
    seen: list[Outbound] = []
    ended: dict[int, Any] = {}
    while not jobs <= set(ended):
        message = _next(supervisor)
        if isinstance(message, agent_pb2.JobExit):
            ended[message.job_id] = message
        else:
            seen.append(message)
    return seen, ended


def _co_runners(seen: list[Outbound], job_id: int) -> list[int]:
    return [
        record.co_runners
        for message in seen
        if isinstance(message, agent_pb2.JobIterations) and message.job_id == job_id
        for record in message.records
    ]


def _parameters(directory: Path) -> dict[str, torch.Tensor]:
    state = torch.load(directory / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    model: dict[str, torch.Tensor] = state["model"]
    return model


def test_two_jobs_on_one_virtual_gpu_train_exactly_as_each_alone(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    spec = {"max_iterations": 40, "workers": 1}
    mlp = {**spec, "workload": "digits-mlp"}
    tiny = {**spec, "workload": "tests.runtime_helpers:TinyTrial"}
    # Alone: each on a slot of its own.
    _start(supervisor, _job(11, 0, tmp_path / "alone-11", spec=mlp, attempt=1))
    _start(supervisor, _job(12, 1, tmp_path / "alone-12", spec=tiny, attempt=1))
    alone, ended = _exits(supervisor, {11, 12})
    assert {e.outcome for e in ended.values()} == {agent_pb2.OUTCOME_SUCCEEDED}
    assert set(_co_runners(alone, 11)) == set(_co_runners(alone, 12)) == {0}

    # Together on slot 0 (same jobs, so same seeds; a later attempt).
    _start(supervisor, _job(11, 0, tmp_path / "shared-11", spec=mlp, attempt=2))
    _start(supervisor, _job(12, 0, tmp_path / "shared-12", spec=tiny, attempt=2))
    assert supervisor.running() == {11: {0: 0}, 12: {0: 0}}
    shared, ended = _exits(supervisor, {11, 12})
    assert {e.outcome for e in ended.values()} == {agent_pb2.OUTCOME_SUCCEEDED}
    # Job 12 started beside 11: its first report says so.
    assert _co_runners(shared, 12)[0] == 1

    for job_id in (11, 12):
        before = _parameters(tmp_path / f"alone-{job_id}")
        after = _parameters(tmp_path / f"shared-{job_id}")
        assert before.keys() == after.keys()
        for name, value in before.items():
            assert torch.equal(value, after[name]), (job_id, name)


def test_a_job_over_its_memory_cap_fails_alone_and_its_neighbour_finishes(
    supervisor: Supervisor,
) -> None:
    slow = {"workload": "tests.runtime_helpers:SlowTrial", "workers": 1, "max_iterations": 200}
    hungry = {"workload": "tests.runtime_helpers:HungryTrial", "workers": 1}
    # The hungry job first, so that the neighbour starts beside it whatever the load.
    # Under 1.5 GiB: torch and the runtime take some hundreds of MiB, the hoard the rest.
    _start(
        supervisor, _job(22, 0, spec={**hungry, "max_iterations": 1000}, memory_bytes=3 * GIB // 2)
    )
    _start(supervisor, _job(21, 0, spec=slow))
    before, ended = _exits(supervisor, {22})
    assert set(ended) == {22}  # the neighbour trains on
    over = ended[22]
    assert over.outcome == agent_pb2.OUTCOME_FAILED
    assert over.error_tail.startswith("memory cap exceeded: peak resident memory")
    assert "cap of 1536 MiB" in over.error_tail and "Traceback" not in over.error_tail
    assert 0 < over.iteration < 1000

    after, neighbour = _until_exit(supervisor, 21)
    assert neighbour.outcome == agent_pb2.OUTCOME_SUCCEEDED and neighbour.iteration == 200
    # It started beside the hungry job (how soon its reports say it is alone again
    # depends on how many it sends after the hungry one's death).
    assert _co_runners(before + after, 21)[0] == 1


def test_a_lowered_cap_is_enforced_from_the_next_boundary_and_a_higher_one_ignored(
    supervisor: Supervisor,
) -> None:
    endless = {"workload": "tests.runtime_helpers:SlowTrial", "workers": 1, "max_iterations": 10**6}
    _start(supervisor, _job(41, 0, spec=endless))  # uncapped: the whole slot
    _until(supervisor, lambda m: isinstance(m, agent_pb2.JobIterations))
    supervisor.cap(41, 2 * _SLOT_MEMORY)  # not lower: ignored, it trains on
    _until(supervisor, lambda m: isinstance(m, agent_pb2.JobIterations))
    # Far below what a torch process holds: the worker fails at the boundary it takes it.
    supervisor.cap(41, 64 << 20)
    _, over = _until_exit(supervisor, 41)
    assert over.outcome == agent_pb2.OUTCOME_FAILED
    assert over.error_tail.startswith("memory cap exceeded: peak resident memory")
    assert "cap of 64 MiB" in over.error_tail and 0 < over.iteration < 10**6


def test_a_placement_past_a_slots_jobs_or_memory_is_refused_with_the_reason(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    endless = {"workload": "tests.runtime_helpers:SlowTrial", "workers": 1, "max_iterations": 10**6}
    for job_id in (31, 32):
        _start(supervisor, _job(job_id, 0, spec=endless))
    # Two jobs share slot 0's two threads; the first started alone with both.
    threads = {
        job_id: json.loads((tmp_path / f"agent/job-{job_id}/rank-0.json").read_text())
        for job_id in (31, 32)
    }
    assert (threads[31]["torch_threads"], threads[32]["torch_threads"]) == (2, 1)
    assert threads[32]["memory_cap_bytes"] == 2 * GIB

    # 2 + 2 GiB held of 8: a 5 GiB cap does not fit; a job with no cap wants all 8.
    _start(supervisor, _job(33, 0, spec=endless, memory_bytes=5 * GIB))
    _start(supervisor, _job(34, 0, spec=endless, memory_bytes=0))
    _, refused = _exits(supervisor, {33, 34})
    for job_id in (33, 34):
        assert refused[job_id].outcome == agent_pb2.OUTCOME_REFUSED
        assert "GPU 0 has 4.00 GiB of its 8.00 GiB free beside jobs [31, 32]" in (
            refused[job_id].error_tail
        )
    # A third job fits in memory; a fourth is past the slot's jobs.
    _start(supervisor, _job(35, 0, spec=endless))
    _start(supervisor, _job(36, 0, spec=endless, memory_bytes=1))
    _, refused = _exits(supervisor, {36})
    assert refused[36].outcome == agent_pb2.OUTCOME_REFUSED
    assert "GPU 0 already holds 3 job(s) ([31, 32, 35])" in refused[36].error_tail
    assert "JIGSAW_AGENT_MAX_JOBS_PER_GPU=3" in refused[36].error_tail
    # Slot 1 is free, and a refused job may be placed again there.
    _start(supervisor, _job(36, 1, spec=endless, attempt=2))
    assert set(supervisor.running()) == {31, 32, 35, 36}
    for job_id in (31, 32, 35, 36):
        supervisor.stop(job_id)
    _, stopped = _exits(supervisor, {31, 32, 35, 36})
    assert {e.outcome for e in stopped.values()} == {agent_pb2.OUTCOME_STOPPED}
