"""The agent's side of the protocol (`jigsaw.v2`): the scheduler's commands into worker
configurations, the supervisor's events into messages for the scheduler.

The one place in the agent, beside its transport (`agent`, `outbox`, `spool`), that
knows the protocol's messages; the typed conversions of the spec, SPB configurations
and profiles are the kernel's (`jigsaw.proto.convert`). A command is the operator's
scheduler speaking, but a launch that cannot be carried out here still only fails its
run, with the reason; what a worker reports was written by trial code and may be forged:
converting it raises a ValueError or TypeError, which the caller drops.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from jigsaw import spb
from jigsaw.gpus import GpuSlot
from jigsaw.jobspec import JobSpec, SPBConfig
from jigsaw.proto import convert
from jigsaw.proto.v2 import agent_pb2 as pb
from jigsaw.spb import SPBProfile
from worker_agent.jobs import (
    Evaluated,
    Iterations,
    JobEnded,
    JobEvent,
    JobLaunch,
    LogLine,
    NodeResources,
    Profiled,
    RunHere,
    Shrunk,
)
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.protocol import IterationRecord, Outcome

Outbound = (
    pb.JobIterations
    | pb.Evaluation
    | pb.LogTail
    | pb.JobExit
    | pb.ModelProfileReport
    | pb.JobShrunk
)

_OUTCOMES = {
    Outcome.SUCCEEDED: pb.OUTCOME_SUCCEEDED,
    Outcome.FAILED: pb.OUTCOME_FAILED,
    Outcome.SUSPENDED: pb.OUTCOME_SUSPENDED,
    Outcome.STOPPED: pb.OUTCOME_STOPPED,
    Outcome.REFUSED: pb.OUTCOME_REFUSED,
}
_SHARING = {"time-sliced": pb.SHARING_TIME_SLICED, "mps": pb.SHARING_MPS}


class InvalidCommand(ValueError):
    """A command that breaks the protocol; the text says why."""


def job_launch(
    command: pb.LaunchCommand, node: NodeResources, code_dir: Path | None = None
) -> JobLaunch:
    """The launch a LaunchCommand asks of this node, with every rank's configuration
    (`code_dir`: the job's code, unpacked here), or with the `problem` that keeps it
    from running here."""
    launch = JobLaunch(
        job_id=command.job_id,
        attempt=command.attempt,
        start_iteration=command.start_iteration,
        config_version=command.config_version,
        gpus={assignment.rank: assignment.gpu_index for assignment in command.ranks},
        memory_bytes=max(command.memory_bytes, 0),
    )
    try:
        return replace(launch, configs=_worker_configs(command, node, code_dir))
    except InvalidCommand as exc:
        return replace(launch, problem=str(exc))


def reconfiguration(command: pb.ReconfigureCommand) -> dict[str, Any]:
    """The SPB configuration a ReconfigureCommand carries, as workers take it (`{}`:
    off); an InvalidCommand when it is not a valid one."""
    try:
        config = convert.spb_config(command.spb) if command.HasField("spb") else None
    except ValidationError as exc:
        raise InvalidCommand(f"invalid spb: {exc}") from exc
    return spb.as_json(config)


def outbound(event: JobEvent) -> Outbound:
    """The message for the scheduler that says what `event` says. A ValueError or
    TypeError when a worker's report does not make one."""
    match event:
        case Iterations(job_id, records):
            return pb.JobIterations(job_id=job_id, records=[_record(r) for r in records])
        case Evaluated(job_id, iteration, metrics):
            return pb.Evaluation(job_id=job_id, iteration=iteration, metrics=metrics)
        case LogLine(job_id, rank, level, message):
            return pb.LogTail(job_id=job_id, rank=rank, level=level, message=message)
        case Profiled(job_id, workload, device_kind, profile):
            try:
                measured = SPBProfile.from_json(profile)
            except (KeyError, AttributeError) as exc:
                raise ValueError(f"not a model profile: {exc!r}") from exc
            utilization = profile.get("utilization")
            return pb.ModelProfileReport(
                job_id=job_id,
                workload=workload,
                device_kind=device_kind,
                profile=convert.profile_message(measured),
                utilization=float(utilization) if isinstance(utilization, float) else None,
            )
        case Shrunk(job_id, attempt, iteration, gpus):
            return pb.JobShrunk(
                job_id=job_id,
                attempt=attempt,
                iteration=iteration,
                ranks=_assignments(gpus),
            )
        case JobEnded():
            return pb.JobExit(
                job_id=event.job_id,
                attempt=event.attempt,
                outcome=_OUTCOMES[event.outcome],
                exit_code=event.exit_code,
                iteration=event.iteration,
                error_tail=event.error_tail,
                metrics=event.metrics,
            )


def gpu(slot: GpuSlot) -> pb.Gpu:
    """A GPU slot as the agent registers it."""
    return pb.Gpu(
        index=slot.index,
        kind=slot.kind,
        memory_bytes=slot.memory_bytes,
        virtual=slot.virtual,
        sharing=_SHARING[slot.sharing],
        max_jobs=slot.max_jobs,
    )


def _record(record: IterationRecord) -> pb.IterationRecord:
    fields = asdict(record)
    # The agent already judged the scope: a device's figure while others ran is unset.
    del fields["utilization_per_process"]
    return pb.IterationRecord(**fields)


def running_jobs(runs: dict[int, RunHere]) -> list[pb.RunningJob]:
    """What a Hello says still runs here: `Supervisor.runs()`."""
    return [
        pb.RunningJob(
            job_id=job_id,
            attempt=run.attempt,
            ranks=_assignments(run.ranks),
            rendezvous_ports=run.ports,
        )
        for job_id, run in runs.items()
    ]


def _assignments(ranks: dict[int, int]) -> list[pb.RankAssignment]:
    return [pb.RankAssignment(rank=rank, gpu_index=gpu) for rank, gpu in ranks.items()]


def _worker_configs(
    command: pb.LaunchCommand, node: NodeResources, code_dir: Path | None
) -> tuple[WorkerConfig, ...]:
    """Every rank's configuration, or an InvalidCommand before anything starts."""
    if not command.ranks:
        raise InvalidCommand("the launch assigns no ranks to this node")
    if not command.master_addr:
        raise InvalidCommand("the launch has no master_addr")
    try:
        spec = convert.job_spec(command.spec)
    except ValueError as exc:
        raise InvalidCommand(f"invalid spec: {exc}") from exc
    indices = [assignment.gpu_index for assignment in command.ranks]
    ranks = [assignment.rank for assignment in command.ranks]
    unknown = sorted(set(indices) - set(node.slots))
    if unknown:
        raise InvalidCommand(
            f"GPU index {unknown} not on this node, which has {sorted(node.slots)}"
        )
    if len(set(indices)) < len(indices) or len(set(ranks)) < len(ranks):
        raise InvalidCommand(f"ranks {ranks} on GPUs {indices}: a rank or GPU is repeated")
    if command.memory_bytes < 0:
        raise InvalidCommand(f"memory_bytes {command.memory_bytes} is negative")
    try:
        launch_spb = convert.spb_config(command.spb) if command.HasField("spb") else None
    except ValidationError as exc:
        raise InvalidCommand(f"invalid spb: {exc}") from exc
    try:
        return tuple(
            _worker_config(
                command, spec, launch_spb, node, assignment.rank, assignment.gpu_index, code_dir
            )
            for assignment in command.ranks
        )
    except ValidationError as exc:
        raise InvalidCommand(f"invalid launch: {exc}") from exc


def _worker_config(
    command: pb.LaunchCommand,
    spec: JobSpec,
    launch_spb: SPBConfig | None,
    node: NodeResources,
    rank: int,
    gpu_index: int,
    code_dir: Path | None,
) -> WorkerConfig:
    resizable = spec.elastic is not None or spec.adaptive
    return WorkerConfig(
        job_id=command.job_id,
        attempt=command.attempt,
        workload=spec.workload,
        hyperparameters=spec.hyperparameters.model_copy(
            update={"batch_size": _global_batch(command, spec)}
        ),
        max_micro_batch=spec.max_micro_batch if resizable else None,
        base_batch=spec.hyperparameters.batch_size if spec.adaptive else None,
        rank=rank,
        world_size=command.world_size,
        master_addr=command.master_addr,
        master_port=command.master_port,
        device=node.slots[gpu_index].device,
        # The spec has no seed; the job id is the same on every rank and resume.
        seed=command.job_id,
        max_iterations=spec.max_iterations,
        target_metric=spec.target_metric,
        eval_every=spec.eval_every,
        backprop=spec.backprop,
        ooo_first_k=spec.ooo_first_k,
        pipeline=spec.pipeline,
        checkpoint_dir=Path(command.checkpoint_dir) if command.checkpoint_dir else None,
        checkpoint_every=command.checkpoint_every or None,
        data_dir=node.data_dir,
        code_dir=code_dir,
        torch_threads=node.torch_threads,
        # No cap from the scheduler: the whole slot (none where its memory is unknown).
        memory_cap_bytes=command.memory_bytes or node.slots[gpu_index].memory_bytes or None,
        spb_enabled=spec.spb != "off",
        # A fresh SPB job measures its model for the scheduler's pricing.
        profile=spec.spb != "off" and command.start_iteration == 0,
        spb=spb.as_json(launch_spb),
        spb_stages=spec.spb.stages if isinstance(spec.spb, SPBConfig) else None,
    )


def _global_batch(command: pb.LaunchCommand, spec: JobSpec) -> int:
    """The batch to train with: the scheduler's choice for an adaptive batch, else the
    spec's; an InvalidCommand outside the spec's range."""
    size = spec.hyperparameters.batch_size
    if not command.global_batch:
        return size
    if spec.batch is None or not spec.batch.adaptive:
        raise InvalidCommand(
            f"global_batch {command.global_batch} for a job whose batch is fixed at {size}"
        )
    low = spec.batch.min if spec.batch.min is not None else size
    high = spec.batch.max if spec.batch.max is not None else size
    if not low <= command.global_batch <= high:
        raise InvalidCommand(
            f"global_batch {command.global_batch} is outside the spec's [{low}, {high}]"
        )
    return command.global_batch
