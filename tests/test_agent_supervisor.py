"""The agent's supervisor with real worker processes on virtual slots (gloo, no mocks)."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from api.server import free_port
from jigsaw.jobspec import JobSpec
from jigsaw.proto import convert
from jigsaw.proto.v2 import agent_pb2
from tests.runtime_helpers import TinyTrial
from worker_agent import wire
from worker_agent.gpus import virtual_slots
from worker_agent.jobs import Iterations, JobEvent, Profiled
from worker_agent.outbox import Outbox
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.protocol import IterationRecord
from worker_agent.supervisor import Supervisor
from worker_agent.wire import Outbound

# How long a test waits for any one message; a job that hangs fails instead of blocking.
_MESSAGE_TIMEOUT_SECONDS = 120
_BIG = 1_000_000  # iterations a job never reaches: it ends only when told to


class CrashingTrial(TinyTrial):
    """A user trial whose loss raises."""

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        raise RuntimeError("the user's loss exploded")


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    supervisor = Supervisor(virtual_slots(2), tmp_path / "agent", stop_grace_seconds=5)
    yield supervisor
    supervisor.close()


@pytest.fixture
def warm_supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    """A supervisor with a warm pool of one; the test checks what close() leaves."""
    supervisor = Supervisor(
        virtual_slots(2), tmp_path / "agent", stop_grace_seconds=5, warm_workers=1
    )
    yield supervisor
    supervisor.close()


def _launch(
    job_id: int,
    *,
    ranks: tuple[tuple[int, int], ...] = ((0, 0), (1, 1)),
    spec: dict[str, Any] | None = None,
    **fields: Any,
) -> agent_pb2.LaunchCommand:
    """A launch of `ranks` (rank, gpu index) of a digits-mlp job, as the scheduler sends it."""
    spec = {
        "name": f"job-{job_id}",
        "workload": "digits-mlp",
        "hyperparameters": {"batch_size": 64},
        "workers": max(len(ranks), 1),
        "max_iterations": 6,
        **(spec or {}),
    }
    command: dict[str, Any] = {
        "job_id": job_id,
        "spec": convert.spec_message(JobSpec.model_validate(spec)),
        "ranks": [agent_pb2.RankAssignment(rank=r, gpu_index=g) for r, g in ranks],
        "world_size": len(ranks),
        "master_addr": "127.0.0.1",
        "master_port": free_port(),
    }
    return agent_pb2.LaunchCommand(**{**command, **fields})


def _with_spec(command: agent_pb2.LaunchCommand, **fields: Any) -> agent_pb2.LaunchCommand:
    """`command` with these fields of its spec changed (past the scheduler's checks)."""
    for name, value in fields.items():
        setattr(command.spec, name, value)
    return command


def _start(supervisor: Supervisor, command: agent_pb2.LaunchCommand) -> None:
    """Hand the supervisor `command`, as the agent does."""
    supervisor.launch(wire.job_launch(command, supervisor.node))


def _next(supervisor: Supervisor) -> Outbound:
    """The supervisor's next event, as the agent sends it."""
    try:
        return wire.outbound(supervisor.outbound.get(timeout=_MESSAGE_TIMEOUT_SECONDS))
    except queue.Empty:
        raise AssertionError("no message from the supervisor") from None


def _until_exit(supervisor: Supervisor, job_id: int) -> tuple[list[Outbound], agent_pb2.JobExit]:
    """Every message up to the job's exit, and the exit."""
    seen: list[Outbound] = []
    while True:
        message = _next(supervisor)
        if isinstance(message, agent_pb2.JobExit) and message.job_id == job_id:
            return seen, message
        seen.append(message)


def _until(supervisor: Supervisor, wanted: Any) -> list[Outbound]:
    """Every message up to the first one `wanted(message)` accepts."""
    seen: list[Outbound] = []
    while not seen or not wanted(seen[-1]):
        seen.append(_next(supervisor))
    return seen


def _is_report(message: Outbound) -> bool:
    return isinstance(message, agent_pb2.JobIterations)


def _assert_gone(pids: dict[int, int]) -> None:
    """Neither the workers nor anything in their process groups is left (reaped too)."""
    assert pids
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


def test_a_two_rank_job_reports_and_succeeds(supervisor: Supervisor, tmp_path: Path) -> None:
    _start(supervisor, _launch(1))
    assert supervisor.running() == {1: {0: 0, 1: 1}}
    pids = supervisor.pids(1)
    seen, end = _until_exit(supervisor, 1)

    records = [
        r.iteration for m in seen if isinstance(m, agent_pb2.JobIterations) for r in m.records
    ]
    assert records == [1, 2, 3, 4, 5, 6]
    assert end.outcome == agent_pb2.OUTCOME_SUCCEEDED
    assert (end.exit_code, end.iteration, end.error_tail) == (0, 6, "")
    assert 0 <= end.metrics["accuracy"] <= 1
    assert any(isinstance(m, agent_pb2.Evaluation) and m.iteration == 6 for m in seen)
    logs = [m for m in seen if isinstance(m, agent_pb2.LogTail)]
    assert {m.rank for m in logs} == {0, 1}
    assert any("succeeded at iteration 6" in m.message and m.level == "INFO" for m in logs)
    assert "succeeded at iteration 6" in (tmp_path / "agent/job-1/rank-1.log").read_text()
    assert supervisor.running() == {}
    _assert_gone(pids)


def test_stop_ends_the_job_and_leaves_no_process(supervisor: Supervisor) -> None:
    _start(supervisor, _launch(2, spec={"max_iterations": _BIG}))
    pids = supervisor.pids(2)
    _until(supervisor, _is_report)

    # While it trains, its launch again is ignored and its GPUs are not given away: it
    # has no memory cap, so it holds all of their memory, and a launch beside it is refused.
    _start(supervisor, _launch(2, spec={"max_iterations": _BIG}))
    _start(supervisor, _launch(3, ranks=((0, 1),)))
    refused = _until(supervisor, lambda m: isinstance(m, agent_pb2.JobExit))[-1]
    assert isinstance(refused, agent_pb2.JobExit) and refused.job_id == 3
    assert refused.outcome == agent_pb2.OUTCOME_REFUSED
    assert "GPU 1 has 0.00 GiB" in refused.error_tail and "beside jobs [2]" in refused.error_tail
    assert supervisor.pids(2) == pids

    supervisor.stop(2, "cancelled by its owner")
    seen, end = _until_exit(supervisor, 2)
    assert end.outcome == agent_pb2.OUTCOME_STOPPED
    assert end.exit_code != 0 and end.iteration >= 1
    assert not any(isinstance(m, agent_pb2.JobExit) for m in seen)  # one exit per job
    assert supervisor.running() == {}
    _assert_gone(pids)


def test_a_job_never_has_two_runs_here_and_older_attempts_never_start(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    _start(supervisor, _launch(5, ranks=((0, 0),), spec={"max_iterations": _BIG}, attempt=2))
    pids = supervisor.pids(5)
    _until(supervisor, _is_report)
    _start(supervisor, _launch(5, ranks=((0, 0),), attempt=2))  # the same command again
    config = json.loads((tmp_path / "agent/job-5/rank-0.json").read_text())
    assert config["attempt"] == 2  # the workers' fence
    # A newer attempt while attempt 2 runs (on a free GPU, too): the scheduler gave up on
    # attempt 2 (its agent fell silent past the timeout, say). Attempt 2 is stopped, and
    # attempt 3 refused until it is gone: REFUSED, which queues the job again, not FAILED.
    _start(supervisor, _launch(5, ranks=((0, 1),), attempt=3))
    _, refused = _until_exit(supervisor, 5)
    assert (refused.attempt, refused.outcome) == (3, agent_pb2.OUTCOME_REFUSED)
    assert "attempt 2 of this job still runs on this node" in refused.error_tail
    _, end = _until_exit(supervisor, 5)
    assert (end.attempt, end.outcome) == (2, agent_pb2.OUTCOME_STOPPED)
    assert supervisor.running() == {}
    _assert_gone(pids)
    # A late launch of an attempt older than one seen here never starts.
    _start(supervisor, _launch(5, ranks=((0, 0),), attempt=1))
    _, stale = _until_exit(supervisor, 5)
    assert (stale.attempt, stale.outcome) == (1, agent_pb2.OUTCOME_FAILED)
    assert "attempt 3 of this job ran on this node" in stale.error_tail
    assert supervisor.running() == {}


def test_a_crashing_user_trial_fails_with_its_traceback(supervisor: Supervisor) -> None:
    workload = f"{__name__}:CrashingTrial"
    _start(supervisor, _launch(4, ranks=((0, 0),), spec={"workload": workload}))
    _, end = _until_exit(supervisor, 4)
    assert end.outcome == agent_pb2.OUTCOME_FAILED and end.exit_code == 1
    assert "RuntimeError: the user's loss exploded" in end.error_tail
    assert supervisor.running() == {}


def test_a_rank_that_dies_ends_its_peers_waiting_at_the_rendezvous(
    supervisor: Supervisor,
) -> None:
    """Rank 1 killed before the gang formed: rank 0 would wait for it at the rendezvous
    for the collective timeout (300 s); the job fails now with rank 1's end."""
    _start(supervisor, _launch(9, spec={"max_iterations": _BIG}))
    pids = supervisor.pids(9)
    os.kill(pids[1], signal.SIGKILL)
    _, end = _until_exit(supervisor, 9)
    assert end.outcome == agent_pb2.OUTCOME_FAILED
    assert end.error_tail.startswith(f"rank 1 exited with code -{int(signal.SIGKILL)}")
    assert supervisor.running() == {}
    _assert_gone(pids)


def test_suspend_checkpoints_after_a_reconfiguration(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    # spb auto: the scheduler may reconfigure it (a job with spb off ignores it).
    spec = {"max_iterations": _BIG, "spb": "auto"}
    _start(supervisor, _launch(5, spec=spec, checkpoint_dir=str(checkpoints)))
    _until(supervisor, _is_report)
    supervisor.reconfigure(5, 1, {"full_fraction": 0.5, "partial_depth": 0.5})
    supervisor.reconfigure(5, 1, {"stale": True})  # not newer: ignored
    _until(
        supervisor,
        lambda m: (
            isinstance(m, agent_pb2.LogTail)
            and "configuration version 1 applied: spb 0.5/0.5" in m.message
        ),
    )
    supervisor.suspend(5)
    _, end = _until_exit(supervisor, 5)
    assert end.outcome == agent_pb2.OUTCOME_SUSPENDED and end.exit_code == 3
    state = torch.load(checkpoints / CHECKPOINT_FILE, weights_only=True)
    assert state["iteration"] == end.iteration >= 1


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (_with_spec(_launch(6), backprop=agent_pb2.BACKPROP_UNSPECIFIED), "invalid spec"),
        (_with_spec(_launch(6), workload="no-such-workload"), "unknown workload"),
        (_launch(6, ranks=((0, 7),)), "GPU index [7] not on this node"),
        (_launch(6, ranks=((0, 0), (1, 0))), "a rank or GPU is repeated"),
        (_launch(6, ranks=()), "assigns no ranks"),
        (_launch(6, master_port=0), "master_port"),
    ],
)
def test_a_malformed_launch_fails_clearly_and_starts_nothing(
    supervisor: Supervisor, tmp_path: Path, command: agent_pb2.LaunchCommand, message: str
) -> None:
    _start(supervisor, command)
    end = _next(supervisor)
    assert isinstance(end, agent_pb2.JobExit) and end.job_id == 6
    assert end.outcome == agent_pb2.OUTCOME_FAILED and message in end.error_tail
    assert supervisor.running() == {}
    assert not (tmp_path / "agent" / "job-6").exists()


def _idle_pid(supervisor: Supervisor, *, other_than: int | None = None) -> int:
    """The pid of the pool's idle worker, once there is one (not `other_than`)."""
    deadline = time.monotonic() + _MESSAGE_TIMEOUT_SECONDS
    while True:
        idle = [pid for pid in supervisor.idle_pids() if pid != other_than]
        if idle:
            assert len(idle) == 1
            return idle[0]
        assert time.monotonic() < deadline, "no idle warm worker"
        time.sleep(0.05)


def _records(messages: list[Outbound]) -> list[int]:
    return [
        r.iteration for m in messages if isinstance(m, agent_pb2.JobIterations) for r in m.records
    ]


def test_a_launch_takes_the_warm_worker_and_the_pool_refills(
    warm_supervisor: Supervisor, tmp_path: Path
) -> None:
    idle = _idle_pid(warm_supervisor)
    _start(warm_supervisor, _launch(7, ranks=((0, 1),)))
    assert warm_supervisor.pids(7) == {0: idle}
    assert warm_supervisor.running() == {7: {0: 1}}
    seen, end = _until_exit(warm_supervisor, 7)

    assert _records(seen) == [1, 2, 3, 4, 5, 6]
    assert end.outcome == agent_pb2.OUTCOME_SUCCEEDED
    assert (end.exit_code, end.iteration, end.error_tail) == (0, 6, "")
    log = (tmp_path / "agent/job-7/rank-0.log").read_text()
    assert "job 7 rank 0" in log and "succeeded at iteration 6" in log
    assert any(isinstance(m, agent_pb2.LogTail) and m.rank == 0 for m in seen)
    _assert_gone({0: idle})

    refilled = _idle_pid(warm_supervisor, other_than=idle)
    warm_supervisor.close()
    _assert_gone({0: refilled})


def test_ranks_beyond_the_pool_start_cold_and_stop_together(warm_supervisor: Supervisor) -> None:
    idle = _idle_pid(warm_supervisor)
    _start(warm_supervisor, _launch(8, spec={"max_iterations": _BIG}))
    pids = warm_supervisor.pids(8)
    assert pids[0] == idle and pids[1] != idle
    _until(warm_supervisor, _is_report)

    warm_supervisor.stop(8, "cancelled by its owner")
    seen, end = _until_exit(warm_supervisor, 8)
    assert end.outcome == agent_pb2.OUTCOME_STOPPED
    assert not any(isinstance(m, agent_pb2.JobExit) for m in seen)
    _assert_gone(pids)


def test_a_warm_worker_dying_idle_is_replaced_without_a_job_exit(
    warm_supervisor: Supervisor,
) -> None:
    idle = _idle_pid(warm_supervisor)
    os.kill(idle, signal.SIGKILL)
    replacement = _idle_pid(warm_supervisor, other_than=idle)
    _assert_gone({0: idle})
    assert warm_supervisor.outbound.empty()
    warm_supervisor.close()
    _assert_gone({0: replacement})


@pytest.mark.parametrize(
    "event",
    [
        Profiled(1, "digits-mlp", "virtual-cpu", {"workload": "digits-mlp"}),
        Profiled(1, "digits-mlp", "virtual-cpu", {"workload": "digits-mlp", "stages": 3}),
        Profiled(
            1,
            "digits-mlp",
            "virtual-cpu",
            {"workload": "digits-mlp", "per_worker_batch": 1, "stages": [{"forward": 1}]},
        ),
        Iterations(1, (IterationRecord("1", 0.1, 0.1, 0, 1, 1, None, 0, 0),)),  # type: ignore[arg-type]
    ],
)
def test_what_trial_code_forged_makes_no_message_and_an_error_the_agent_drops(
    event: JobEvent,
) -> None:
    """Rank 0 runs trial code, which may send anything as its reports: the agent's pump
    drops what raises ValueError or TypeError and goes on; anything else would end it."""
    with pytest.raises((ValueError, TypeError)):
        wire.outbound(event)


def test_the_outbox_sends_a_runs_first_records_at_once() -> None:
    # Here rather than beside the other outbox tests: the agent's outbox, as configured.
    outbox = Outbox(batch_records=100, batch_seconds=3600, first_records_at_once=True)
    never = threading.Event()
    first = agent_pb2.JobIterations(job_id=1, records=[agent_pb2.IterationRecord(iteration=1)])
    outbox.put(first)
    assert outbox.next_message(0, never) is not None  # the run's start: not batched
    outbox.put(agent_pb2.JobIterations(job_id=1, records=[agent_pb2.IterationRecord(iteration=2)]))
    assert outbox.next_message(0, never) is None  # later ones wait for their batch
    outbox.put(agent_pb2.JobExit(job_id=1))
    outbox.put(first)  # a new run of the job (a resume) starts at once again
    message = outbox.next_message(0, never)
    assert message is not None and message.HasField("reports")
    exit_message = outbox.next_message(0, never)
    assert exit_message is not None and exit_message.HasField("exit")
    # Either side of an in-place shrink the run goes on, but its records are urgent.
    outbox.put(agent_pb2.JobIterations(job_id=1, records=[agent_pb2.IterationRecord(iteration=2)]))
    assert outbox.next_message(0, never) is None
    outbox.put(
        agent_pb2.JobIterations(job_id=1, records=[agent_pb2.IterationRecord(iteration=3)]),
        urgent=True,
    )
    message = outbox.next_message(0, never)
    assert message is not None and len(message.reports.jobs[0].records) == 2


def _elastic(job_id: int, checkpoints: Path, **fields: Any) -> agent_pb2.LaunchCommand:
    """A 2-rank elastic job that may run on 1 (global batch 64: 2 x 32, or 1 x 32 x 2)."""
    spec = {"max_iterations": _BIG, "workers": 2, "elastic": {"min_workers": 1, "max_workers": 2}}
    return _launch(job_id, spec=spec, checkpoint_dir=str(checkpoints), attempt=4, **fields)


def _records_past(supervisor: Supervisor, earlier: list[Outbound], boundary: int) -> list[Any]:
    """The job's iteration records in `earlier` and on until a few past `boundary`: every
    iteration once, in order, the job not having exited."""
    after = _until(supervisor, lambda m: _is_report(m) and m.records[-1].iteration > boundary + 2)
    assert not any(isinstance(m, agent_pb2.JobExit) for m in earlier + after)
    records = [r for m in earlier + after if _is_report(m) for r in m.records]
    assert [r.iteration for r in records] == list(range(1, records[-1].iteration + 1))
    return records


def _gone_soon(pid: int) -> None:
    deadline = time.monotonic() + _MESSAGE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not exit")


def test_a_job_shrinks_in_place_in_the_same_process_and_frees_the_gpu_it_left(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    launch = _elastic(8, tmp_path / "checkpoints")
    _start(supervisor, launch)
    pids = supervisor.pids(8)
    before = _until(supervisor, _is_report)

    # The new gang as a restart would be launched: rank 0 alone, on its GPU, same attempt.
    smaller = agent_pb2.LaunchCommand()
    smaller.CopyFrom(launch)
    del smaller.ranks[1:]
    smaller.world_size, smaller.master_port = 1, free_port()
    supervisor.resize_in_place(wire.job_launch(smaller, supervisor.node))
    seen = _until(supervisor, lambda m: isinstance(m, agent_pb2.JobShrunk))
    shrunk = seen[-1]
    assert isinstance(shrunk, agent_pb2.JobShrunk)
    assert (shrunk.job_id, shrunk.attempt) == (8, 4)
    assert [(a.rank, a.gpu_index) for a in shrunk.ranks] == [(0, 0)]
    ports = [launch.master_port, smaller.master_port]  # a Hello's account of them
    assert supervisor.runs() == {8: (4, {0: 0}, ports)} and supervisor.pids(8) == {0: pids[0]}
    _gone_soon(pids[1])

    # It trains on from the checkpoint of the boundary, one worker, in the same process.
    records = _records_past(supervisor, before + seen, shrunk.iteration)
    assert {r.workers for r in records if r.iteration > shrunk.iteration} == {1}
    assert {r.workers for r in records if r.iteration <= shrunk.iteration} == {2}
    state = torch.load(tmp_path / "checkpoints" / CHECKPOINT_FILE, weights_only=True)
    assert state["iteration"] == shrunk.iteration
    log = (tmp_path / "agent/job-8/rank-0.log").read_text()
    assert f"resumed from the checkpoint at iteration {shrunk.iteration}" in log

    # The GPU it left takes another job (it held the whole GPU: no memory cap).
    _start(supervisor, _launch(9, ranks=((0, 1),)))
    _, other = _until_exit(supervisor, 9)
    assert other.outcome == agent_pb2.OUTCOME_SUCCEEDED
    supervisor.suspend(8)
    _, end = _until_exit(supervisor, 8)
    assert (end.outcome, end.exit_code, end.attempt) == (agent_pb2.OUTCOME_SUSPENDED, 3, 4)
    _assert_gone(pids)


def test_a_job_grows_in_place_keeping_its_process_and_its_joiner_resumes_at_the_boundary(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """1 rank becomes 2 on this node: rank 0 checkpoints at the boundary and goes on in
    its process; the new rank starts only then and resumes from that checkpoint."""
    launch = _elastic(12, tmp_path / "checkpoints", ranks=((0, 0),), world_size=1)
    _start(supervisor, launch)
    pids = supervisor.pids(12)
    before = _until(supervisor, _is_report)

    larger = agent_pb2.LaunchCommand()
    larger.CopyFrom(launch)
    larger.ranks.add(rank=1, gpu_index=1)
    larger.world_size, larger.master_port = 2, free_port()
    supervisor.resize_in_place(wire.job_launch(larger, supervisor.node))
    seen = _until(supervisor, lambda m: isinstance(m, agent_pb2.JobShrunk))
    grown = seen[-1]
    assert isinstance(grown, agent_pb2.JobShrunk)
    assert [(a.rank, a.gpu_index) for a in grown.ranks] == [(0, 0), (1, 1)]
    now = supervisor.pids(12)
    ports = [launch.master_port, larger.master_port]
    assert supervisor.runs() == {12: (4, {0: 0, 1: 1}, ports)} and now[0] == pids[0]
    [told] = wire.running_jobs(supervisor.runs())  # what a Hello says of it
    assert list(told.rendezvous_ports) == ports

    records = _records_past(supervisor, before + seen, grown.iteration)
    assert {r.workers for r in records if r.iteration <= grown.iteration} == {1}
    assert {r.workers for r in records if r.iteration > grown.iteration} == {2}
    log = (tmp_path / "agent/job-12/rank-1.log").read_text()
    assert f"resumed from the checkpoint at iteration {grown.iteration}" in log
    supervisor.suspend(12)
    _, end = _until_exit(supervisor, 12)
    assert (end.outcome, end.attempt) == (agent_pb2.OUTCOME_SUSPENDED, 4)
    _assert_gone(now)


def test_an_adaptive_job_changes_its_batch_in_place_in_the_same_processes(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """A rebatch: the same gang, another global batch (the scheduler's choice for
    goodput). Every rank checkpoints at the boundary and goes on in its process at the
    new batch; no rank leaves, no GPU is freed, the job never exits."""
    spec = {"max_iterations": _BIG, "batch": {"min": 32, "max": 256, "adaptive": True}}
    launch = _launch(11, spec=spec, checkpoint_dir=str(tmp_path / "checkpoints"), attempt=2)
    _start(supervisor, launch)
    pids = supervisor.pids(11)
    before = _until(supervisor, _is_report)

    larger = agent_pb2.LaunchCommand()
    larger.CopyFrom(launch)
    larger.global_batch, larger.master_port = 128, free_port()
    supervisor.resize_in_place(wire.job_launch(larger, supervisor.node))
    seen = _until(supervisor, lambda m: isinstance(m, agent_pb2.JobShrunk))
    rebatched = seen[-1]
    assert isinstance(rebatched, agent_pb2.JobShrunk)
    assert [(a.rank, a.gpu_index) for a in rebatched.ranks] == [(0, 0), (1, 1)]
    ports = [launch.master_port, larger.master_port]
    assert supervisor.runs() == {11: (2, {0: 0, 1: 1}, ports)} and supervisor.pids(11) == pids

    records = _records_past(supervisor, before + seen, rebatched.iteration)
    assert {r.batch_size for r in records if r.iteration <= rebatched.iteration} == {64}
    assert {r.batch_size for r in records if r.iteration > rebatched.iteration} == {128}
    assert {r.workers for r in records} == {2}
    supervisor.suspend(11)
    _, end = _until_exit(supervisor, 11)
    assert end.outcome == agent_pb2.OUTCOME_SUSPENDED
    _assert_gone(pids)


def test_a_shrink_that_cannot_happen_in_place_suspends_the_job(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """Rank 0's GPU would not be kept: the job checkpoints and exits, for a restart."""
    launch = _elastic(10, tmp_path / "checkpoints")
    _start(supervisor, launch)
    _until(supervisor, _is_report)
    elsewhere = agent_pb2.LaunchCommand()
    elsewhere.CopyFrom(launch)
    del elsewhere.ranks[:]
    elsewhere.ranks.add(rank=0, gpu_index=1)
    elsewhere.world_size = 1
    supervisor.resize_in_place(wire.job_launch(elsewhere, supervisor.node))
    seen, end = _until_exit(supervisor, 10)
    assert end.outcome == agent_pb2.OUTCOME_SUSPENDED
    assert not any(isinstance(m, agent_pb2.JobShrunk) for m in seen)
    state = torch.load(tmp_path / "checkpoints" / CHECKPOINT_FILE, weights_only=True)
    assert state["iteration"] == end.iteration
