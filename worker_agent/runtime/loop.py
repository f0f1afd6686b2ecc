"""The training loop the platform runs around a `Trial`, one process per GPU slot.

Every iteration starts at a boundary where rank 0 consults its controller and all ranks
agree on what to do (`boundary`), so that suspending, stopping or reconfiguring happens
at the same iteration everywhere. How gradients are computed and exchanged is the
backward schedule's (`schedules`), chosen once from the job's spec: PyTorch's DDP in its
standard mode; for jobs that may run structured partial backprop (spec `spb` not `off`)
each stage's gradient exchanged among its contributors (ranks train only the stages
above their cut, `spb.partial`); with `backprop: ooo` an out-of-order schedule, which
averages each layer over its stage's contributors when SPB is on; with `pipeline`, one
stage of the model per rank on every batch.
"""

from __future__ import annotations

import gc
import logging
import traceback
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from jigsaw import spb
from jigsaw.spb import SPBProfile
from worker_agent.runtime import checkpoint, rng
from worker_agent.runtime.boundary import Agreement, BoundarySync
from worker_agent.runtime.config import WorkerConfig
from worker_agent.runtime.control import Controller
from worker_agent.runtime.kfac import KFACSGD
from worker_agent.runtime.memory_cap import MemoryCap, MemoryCapExceeded
from worker_agent.runtime.protocol import Action, Decision, ExitStatus, IterationRecord, Outcome
from worker_agent.runtime.reporting import ReportBuffer
from worker_agent.runtime.sampling import DataPosition, ShardedBatches, to_device
from worker_agent.runtime.schedules import registry
from worker_agent.runtime.schedules.base import Parts
from worker_agent.runtime.schedules.elastic import batch_split
from worker_agent.runtime.spb import stages
from worker_agent.runtime.spb.partial import PartialBackprop
from worker_agent.runtime.spb.profiler import profile_model
from worker_agent.runtime.timing import DeviceClock, Mark, peak_memory_bytes, utilization_meter
from worker_agent.runtime.trial import PipelineSplit, TrialContext
from worker_agent.runtime.workloads import load_trial

logger = logging.getLogger(__name__)

# Enough of a traceback to diagnose a failure from the job's events.
_ERROR_TAIL_CHARS = 4000
# Timed passes per figure when a job profiles its model: a few seconds at start.
_PROFILE_REPEATS = 3


def run_worker(config: WorkerConfig, controller: Controller) -> ExitStatus:
    """Train until succeeded, stopped, suspended or left, and say how it ended.

    An in-place shrink ends a run at its boundary (checkpointed): this process then
    either leaves, or forms the smaller gang's group and trains on from that checkpoint
    as the rank the controller gives it, as a restarted process would, without the
    process's exit and start. A failure is reported to the controller and re-raised.
    """
    status = ExitStatus(Outcome.FAILED, 0)
    training: _Training | None = None
    try:
        while True:
            device = torch.device(config.device)
            cap = MemoryCap(device, config.memory_cap_bytes)
            _init_distributed(config, device)
            training = _Training(config, controller, device, cap)
            status = training.run()
            if status.outcome is not Outcome.SHRUNK:
                return status
            training = None
            _leave_group()
            shrunk = controller.shrunk(status.iteration)
            if shrunk is None:
                status = ExitStatus(Outcome.LEFT, status.iteration)
                return status
            config = shrunk
    except MemoryCapExceeded as exc:
        # Over its share of a shared slot: this rank fails with that reason, no traceback.
        logger.error("%s", exc)
        iteration = training.iteration if training is not None else 0
        status = ExitStatus(Outcome.FAILED, iteration, error_tail=str(exc))
        return status
    except checkpoint.Fenced as exc:
        # A newer run of the job owns its checkpoints: this one is stale and goes away.
        logger.warning("%s", exc)
        status = ExitStatus(Outcome.STOPPED, training.iteration if training is not None else 0)
        return status
    except BaseException:
        status = ExitStatus(
            Outcome.FAILED,
            training.iteration if training is not None else 0,
            error_tail=traceback.format_exc()[-_ERROR_TAIL_CHARS:],
        )
        raise
    finally:
        training = None
        _leave_group()
        controller.exit(status)


def _leave_group() -> None:
    """Destroy the process group, after what holds it (the caller dropped its training).

    DDP's reducer and its comm hook's futures go first, while the group is alive: freed
    after the group's destruction, the last reference would fall to DDP's and join
    gloo's threads under the GIL, which one of them may be waiting for (a hang seen in
    about half of the runs of a short two-rank job).
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # what the run cached goes back to the GPU's other jobs


def _init_distributed(config: WorkerConfig, device: torch.device) -> None:
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=config.resolved_backend,
        init_method=f"tcp://{config.master_addr}:{config.master_port}",
        rank=config.rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.collective_timeout_seconds),
    )


class _Training:
    def __init__(
        self, config: WorkerConfig, controller: Controller, device: torch.device, cap: MemoryCap
    ) -> None:
        self._config = config
        self._cap = cap
        self._controller = controller
        self._device = device
        self._rank0 = config.rank == 0
        pipeline = config.pipeline
        context = TrialContext(
            hyperparameters=config.hyperparameters,
            rank=config.rank,
            world_size=config.world_size,
            device=device,
            seed=config.seed,
            data_dir=config.data_dir,
            pipeline_stages=pipeline.stages if pipeline is not None else 1,
        )
        # An elastic or adaptive job splits its batch over ranks and micro-batches.
        split = batch_split(config) if config.max_micro_batch is not None else None
        rank_batch = split.per_worker if split is not None else context.per_rank_batch_size
        self._global_batch = rank_batch * context.replicas
        if config.hyperparameters.batch_size != self._global_batch:
            logger.warning(
                "batch_size %d is not a multiple of %d data-parallel replicas: the global "
                "batch is %d",
                config.hyperparameters.batch_size,
                context.replicas,
                self._global_batch,
            )

        # Everything a trial builds comes from the job's seed alone, identically on every
        # rank; per-rank streams start only after (and are what checkpoints restore).
        torch.manual_seed(config.seed)
        self._trial = load_trial(config.workload)(context)
        model = self._trial.build_model()
        # Every pipeline rank builds the whole model and trains the part the trial cuts
        # for its stage; only rank 0, which evaluates the whole model, keeps all of it on
        # the device.
        self._split: PipelineSplit | None = (
            self._trial.pipeline(model, pipeline.stages) if pipeline is not None else None
        )
        trained = self._split.parts[config.rank] if self._split is not None else model
        (model if self._rank0 else trained).to(device)
        # K-FAC preconditions per layer, so it is built around the model, not its parameters.
        kfac = (
            KFACSGD(model, config.hyperparameters.learning_rate)
            if config.hyperparameters.optimizer == "kfac"
            else None
        )
        self._optimizer = (
            kfac if kfac is not None else self._trial.build_optimizer(trained.parameters())
        )
        dataset = self._trial.train_data()
        rng.seed_rank(config.seed, config.rank)
        resumed = (
            checkpoint.load(
                config.checkpoint_dir,
                model=trained,
                optimizer=self._optimizer,
                stages=self._split is not None,
                attempt=config.attempt,
                global_batch=self._global_batch,
                resizable=split is not None,
            )
            if config.checkpoint_dir is not None
            else None
        )
        self.iteration = resumed.iteration if resumed is not None else 0
        # Steps of the base batch the steps so far are worth: what `max_iterations`
        # counts (an adaptive batch's step counts AdaScale's gain; any other step, 1).
        self.progress = float(self.iteration)
        if resumed is not None and resumed.progress is not None:
            self.progress = resumed.progress

        self._net = model  # unwrapped and whole: what evaluation sees
        self._trained = trained  # what this rank trains and checkpoints
        self._clock = DeviceClock(device)
        self._sync = BoundarySync(config.rank, config.world_size, device, config.spb)
        # SPB's cut (which stages this rank trains) is independent of who exchanges the
        # gradients: SPB's own exchange, or an out-of-order schedule's.
        self._partial: PartialBackprop | None = None
        if config.spb_enabled:
            self._partial = PartialBackprop(
                stages.build(model, self._trial.stages(model), config.spb_stages),
                model,
                rank=config.rank,
                world_size=config.world_size,
                config=spb.resolve(config.spb),
                agreement=self._sync,
            )
        # The one place the backward schedule is chosen: the loop only drives it.
        self._schedule = registry.build(
            Parts(
                config=config,
                trial=self._trial,
                model=model,
                trained=trained,
                split=self._split,
                optimizer=self._optimizer,
                kfac=kfac,
                device=device,
                clock=self._clock,
                agreement=self._sync,
                partial=self._partial,
            )
        )
        if resumed is not None and resumed.schedule is not None:
            self._schedule.restore(resumed.schedule)
        try:
            self._batches = ShardedBatches(
                dataset,
                rank=context.replica,
                world_size=context.replicas,
                batch_size=rank_batch,
                seed=config.seed,
                start=resumed.position if resumed is not None else DataPosition(),
            )
        except ValueError as exc:
            if config.base_batch is None:
                raise
            raise ValueError(
                f"{exc}: the scheduler chose a global batch of {self._global_batch} for "
                "goodput within the spec's batch.max, which this job's data cannot hold; "
                "lower batch.max"
            ) from exc
        self._reports = ReportBuffer(
            controller, config.report_every_iterations, config.report_every_seconds
        )
        self._utilization = utilization_meter(device)
        self._config_version = 0
        self._decision: Decision | None = None  # rank 0's, for the coming boundary
        self._metrics: dict[str, float] = {}
        self._evaluated_at: int | None = None
        self._target_reached = False
        if resumed is not None:
            self._announce(f"resumed from the checkpoint at iteration {self.iteration}")

    def run(self) -> ExitStatus:
        # The peers wait for rank 0's measurement at the next collective.
        profile: SPBProfile | None = None
        wanted = self._schedule.needs_profile or (self._config.profile and self.iteration == 0)
        if self._rank0 and wanted:
            profile = self._profile()
        self._schedule.start(profile)
        # The first boundary of this process has no step to hide its agreement behind.
        agreed = self._agree_now(self._check(self.iteration))
        while True:
            if agreed.decision.config_version != self._config_version:
                self._config_version = agreed.decision.config_version
                self._reconfigure(agreed.decision.config)
            if self._cap.lower(agreed.decision.memory_bytes):
                self._announce(f"memory cap lowered to {agreed.decision.memory_bytes >> 20} MiB")
            outcome = self._outcome(agreed)
            if outcome is not None:
                return self._finish(outcome)
            agreed = self._step(agreed)
            self.iteration += 1
            every = self._config.checkpoint_every
            if every is not None and self.iteration % every == 0:
                self._checkpoint()
            if self.iteration % self._config.eval_every == 0:
                self._evaluate()
                # Every rank knows evaluation boundaries, so all agree once more there:
                # a reached target stops everyone at this very boundary.
                agreed = self._agree_now(self._decision)

    def _reconfigure(self, config: dict[str, Any]) -> None:
        version = self._config_version
        if self._partial is None:
            # The spec said `spb: off`: the job runs plain DDP and keeps doing so.
            self._announce(f"configuration version {version} ignored: this job runs spb off")
            return
        self._partial.configure(spb.resolve(config))
        self._announce(
            f"configuration version {version} applied: spb {spb.config_key(self._partial.config)}"
        )

    def _profile(self) -> SPBProfile:
        """Measure the model's per-stage costs on a copy (so that training, its RNG streams
        and BatchNorm statistics included, goes on as if it had not happened) and report
        them as the workload's model profile."""
        state = rng.capture()
        try:
            # A new instance with the current state, not a deep copy: the hooks training
            # put on the model (K-FAC's, the out-of-order schedules') hold process groups.
            copy = self._trial.build_model().to(self._device)
            copy.load_state_dict(self._net.state_dict())
            busy = utilization_meter(self._device)
            profile = profile_model(
                self._config.workload,
                self._trial,
                copy,
                stages=self._config.spb_stages,
                repeats=_PROFILE_REPEATS,
            )
            utilization = busy.sample()
        finally:
            rng.restore(state)
        # How busy the device was while the model ran alone on it: what co-location
        # decisions start from before the job reports iterations.
        self._controller.profile(
            self._config.workload, {**profile.to_json(), "utilization": utilization}
        )
        self._announce(f"measured the model: {len(profile.stages)} stages")
        return profile

    def _check(self, boundary: int) -> Decision | None:
        if not self._rank0:
            return None
        self._decision = self._controller.check(boundary)
        directory = self._config.checkpoint_dir
        if directory is not None and checkpoint.fenced(directory, self._config.attempt):
            # A newer run of the job started: this one stops at this boundary, everywhere.
            logger.warning("a newer attempt of this job owns %s: stopping", directory)
            self._decision = replace(self._decision, action=Action.STOP)
        return self._decision

    def _agree_now(self, decision: Decision | None) -> Agreement:
        return self._sync.agree(self.iteration, decision, self._target_reached)

    def _outcome(self, agreed: Agreement) -> Outcome | None:
        limit = self._config.max_iterations
        if agreed.target_reached or (limit is not None and self.progress >= limit):
            return Outcome.SUCCEEDED
        if agreed.decision.action is Action.STOP:
            return Outcome.STOPPED
        if agreed.decision.action is Action.SUSPEND:
            return Outcome.SUSPENDED
        if agreed.decision.action is Action.SHRINK:
            return Outcome.SHRUNK
        return None

    def _step(self, agreed: Agreement) -> Agreement:
        """One iteration, and the agreement on the boundary after it.

        Inside the lease of the last agreement every rank already knows the answer for
        the next boundary (continue, same configuration): no question and no collective,
        so a lease of many short steps costs one agreement. At the lease's end rank 0
        asks before the step, so that the agreement rides in the step's gradient
        exchange, or has an all-reduce of its own during backward.
        """
        boundary = self.iteration + 1
        agreeing = boundary >= agreed.decision.lease_until
        decision = self._check(boundary) if agreeing else None
        start = self._clock.mark()
        if self._partial is not None:
            before = self._partial.depths
            depths = self._partial.begin(self.iteration)
            if depths != before:
                self._tell_contributors(depths)
        with self._cap.guard():
            batch = to_device(self._batches.next(), self._device)
            self._schedule.zero_grad()
            if agreeing:
                self._sync.offer(boundary, decision, self._target_reached)
            loss = self._schedule.forward_backward(batch, agreeing)
            backward_end = self._clock.mark()
            self._schedule.step()
            end = self._clock.mark()
        # Every rank measured the same noise, so all count the same progress and stop
        # at `max_iterations` together without a collective.
        self.progress += self._schedule.step_progress()
        if agreeing:
            agreed = self._sync.wait()
        if self._rank0:
            assert loss is not None, "rank 0 (a pipeline's first stage) receives the loss"
            self._clock.synchronize()
            self._reports.add(self._record(start, backward_end, end, loss.item()))
        return agreed

    def _tell_contributors(self, depths: tuple[int, ...]) -> None:
        """Tell whoever averages per layer which ranks now train each stage."""
        assert self._partial is not None
        cut = self._partial.stages
        self._schedule.set_contributors(cut.modules, spb.contributors(depths, len(cut)))

    def _record(self, start: Mark, backward_end: Mark, end: Mark, loss: float) -> IterationRecord:
        step = self._clock.seconds(start, end)
        comm, wire_bytes = self._schedule.communication(backward_end)
        noise = self._schedule.gradient_noise()
        return IterationRecord(
            iteration=self.iteration + 1,
            step_seconds=step,
            compute_seconds=step - comm,
            comm_seconds=comm,
            samples_per_second=self._global_batch / step,
            loss=loss,
            utilization=self._utilization.sample(),
            utilization_per_process=self._utilization.per_process,
            peak_memory_bytes=peak_memory_bytes(self._device),
            bytes_communicated=wire_bytes,
            spb_depth=self._partial.depth_fraction if self._partial is not None else None,
            batch_size=self._global_batch,
            learning_rate=float(self._optimizer.param_groups[0]["lr"]),
            grad_sqr=noise.sqr if noise is not None else None,
            grad_var=noise.var if noise is not None else None,
            workers=self._config.world_size,
            progress=self.progress,
        )

    def _evaluate(self) -> None:
        """Every rank, at the same boundaries (a pipeline's stages gather their parts to
        rank 0); rank 0 evaluates the whole model."""
        self._evaluated_at = self.iteration
        self._schedule.before_evaluation()
        if not self._rank0:
            return
        model = self._net
        # Evaluation runs on rank 0 alone; it must not perturb rank 0's random streams.
        state = rng.capture()
        model.eval()
        try:
            metrics = self._trial.evaluate(model)
        finally:
            model.train()
            rng.restore(state)
        self._metrics = {name: float(value) for name, value in metrics.items()}
        self._controller.evaluation(self.iteration, self._metrics)
        self._target_reached = self._meets_target()

    def _meets_target(self) -> bool:
        target = self._config.target_metric
        if target is None:
            return False
        if target.name not in self._metrics:
            raise ValueError(
                f"target metric {target.name!r} is not among the evaluated metrics "
                f"{sorted(self._metrics)}"
            )
        return target.reached_by(self._metrics[target.name])

    def _finish(self, outcome: Outcome) -> ExitStatus:
        if self._rank0:
            self._reports.flush()
        if outcome is Outcome.SUCCEEDED and self._evaluated_at != self.iteration:
            self._evaluate()
        if outcome in (Outcome.SUSPENDED, Outcome.SHRUNK) and self._config.checkpoint_dir is None:
            logger.warning("no checkpoint_dir: progress up to iteration %d is lost", self.iteration)
        if outcome in (Outcome.SUCCEEDED, Outcome.SUSPENDED, Outcome.SHRUNK):
            self._checkpoint()
        self._announce(f"{outcome.value} at iteration {self.iteration}")
        return ExitStatus(outcome, self.iteration, dict(self._metrics), self._config_version)

    def _checkpoint(self) -> None:
        """Collective (every rank knows the boundaries that checkpoint)."""
        if self._config.checkpoint_dir is not None:
            self._schedule.flush()
            checkpoint.save(
                self._config.checkpoint_dir,
                model=self._trained,
                optimizer=self._optimizer,
                iteration=self.iteration,
                position=self._batches.position,
                stages=self._split is not None,
                attempt=self._config.attempt,
                global_batch=self._global_batch,
                schedule=self._schedule.state(),
                progress=self.progress,
            )

    def _announce(self, message: str) -> None:
        # The agent forwards the worker's stderr, so a log line is all it takes.
        logger.info(message)
