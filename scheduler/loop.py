"""The scheduling round loop.

Each round, in short transactions so the API is never blocked for long:
  1. ingest the dispatcher's reports (progress, jobs that ended);
  2. expire agents that stopped heartbeating: their jobs lose their GPUs and requeue;
  3. release the GPUs of jobs that ended otherwise (cancelled or suspended through the
     API), stop or suspend processes the database no longer wants running, and queue
     again the jobs a node drain suspended once their processes are gone;
  4. snapshot the cluster, ask the policy for a plan, apply it and dispatch.

The API changes job states concurrently, so every transition here may lose a race
(IllegalTransition); that job is skipped for this round, never the whole round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from scheduler.core import rounds
from scheduler.core.plan import Placement, Plan, Reconfigure, Resize
from scheduler.core.quota import QuotaDecision, Quotas, schedule_within
from scheduler.core.rounds import Decision, RoundResult
from scheduler.core.snapshot import ClusterSnapshot, GPUView, JobView
from scheduler.core.states import TERMINAL, IllegalTransition, JobState, SuspendedBy
from scheduler.core.validate import validate
from scheduler.core.waits import (
    UNPLACEABLE,
    Wait,
    estimated_starts,
    exiting_reason,
    explain,
    freeing_reason,
    unheard_reason,
)
from scheduler.db import transaction
from scheduler.dispatch import Dispatcher, Launch, Report, RunOutcome, Worker
from scheduler.models import agents, allocations
from scheduler.models import code as code_models
from scheduler.models import jobs as job_models
from scheduler.models import queues as queue_models
from scheduler.models import resizes as resize_models
from scheduler.models import starts as start_models
from scheduler.models.nodes import on_drained_node, suspended_to_requeue
from scheduler.models.resizes import IN_PLACE, RESTART
from scheduler.models.rounds import prune_rounds, record_round
from scheduler.models.snapshot import build_snapshot
from scheduler.models.states import transition
from scheduler.orm import Job, utcnow
from scheduler.policies import get_policy
from scheduler.resize import PendingResize, in_place
from scheduler.resize import refusal as resize_refusal
from scheduler.settings import SchedulerSettings
from scheduler.telemetry import SchedulerTelemetry

logger = logging.getLogger(__name__)

ACTOR = "scheduler"

# Jobs that lose their GPUs when an agent dies go back to the queue; a suspended job
# keeps its state and is simply placed afresh when resumed.
_REQUEUE_FROM = (JobState.SCHEDULED, JobState.RUNNING)
# States whose jobs should have processes on the nodes they are allocated.
_PLACED = (JobState.SCHEDULED, JobState.RUNNING)
# States whose jobs hold no GPUs: ended, or suspended (placed afresh on resume).
_RELEASED = (*TERMINAL, JobState.SUSPENDED)
# Why a suspended job the loop queues again is queued, by who suspended it.
_REQUEUED_BECAUSE: dict[str, str] = {
    SuspendedBy.DRAIN: "its node was drained",
    SuspendedBy.RESIZE: "its resize was lost in a leader failover",
}
# A job's message holds the end of an error, not a whole log.
_MESSAGE_CHARS = 4000
# Stored rounds are pruned to JIGSAW_SCHEDULER_ROUNDS_KEPT, and code archives past their
# retention deleted, once every this many rounds.
_PRUNE_EVERY = 100
# Iterations a run reports before its memory cap is lowered to what they showed.
_CAP_SETTLE_ITERATIONS = 5


class SchedulerService:
    def __init__(
        self,
        factory: sessionmaker[Session],
        dispatcher: Dispatcher,
        settings: SchedulerSettings,
        policy_name: str | None = None,
        *,
        telemetry: SchedulerTelemetry | None = None,
        leader_name: str = "",
    ) -> None:
        self._factory = factory
        self._dispatcher = dispatcher
        self._settings = settings
        self._policy_name = policy_name or settings.policy
        self._policy = get_policy(self._policy_name, settings.policy_params(self._policy_name))
        self._telemetry = telemetry
        self._leader_name = leader_name
        self._conflicts = 0
        self._decisions: list[Decision] = []
        self._recorded = 0
        self._rounds = 0
        # Resizes asked of running jobs, by job: not yet relaunched, and relaunched with
        # their cost not yet measured (scheduler/resize.py).
        self._resizing: dict[int, PendingResize] = {}
        self._measuring: dict[int, PendingResize] = {}
        # Jobs launched whose start is not yet measured: the iteration each begins at.
        self._starting: dict[int, int] = {}
        # This process's first round: what agents sent before it reached no scheduler.
        self._leading_since: datetime | None = None

    def run_forever(self, stop: threading.Event, leading: Callable[[], bool] | None = None) -> None:
        """Run rounds every `round_seconds` until `stop` is set, or until `leading` (the
        leader lock's check, asked before every round) says this process lost the lock.

        A failed round is logged and recorded; the loop goes on.
        """
        while not stop.is_set():
            if leading is not None and not leading():
                logger.error("lost the scheduler leader lock; no more rounds here")
                return
            started = time.monotonic()
            clock = time.perf_counter()
            now = utcnow()
            try:
                result = self.run_round(now)
                logger.debug("round: %s", result)
                self.record(result)
                self._rounds += 1
                if self._rounds % _PRUNE_EVERY == 1:
                    self.expire_code(now)
            except Exception as exc:
                logger.exception("scheduling round failed; retrying next round")
                partial = RoundResult(
                    started_at=now,
                    conflicts=self._conflicts,
                    seconds=time.perf_counter() - clock,
                    decisions=tuple(self._decisions),
                )
                self.record(partial, error=f"{type(exc).__name__}: {exc}"[:_MESSAGE_CHARS])
            stop.wait(max(self._settings.round_seconds - (time.monotonic() - started), 0.0))

    def record(self, result: RoundResult, error: str | None = None) -> None:
        """Count the round in Prometheus and store it for the dashboard (unless
        `rounds_kept` is 0); a failure to store is logged, never raised."""
        if self._telemetry is not None:
            self._telemetry.observe_round(result, error)
        keep = self._settings.rounds_kept
        if keep == 0:
            return
        try:
            with transaction(self._factory) as session:
                record_round(session, result, leader=self._leader_name, error=error)
                self._recorded += 1
                if self._recorded % _PRUNE_EVERY == 0:
                    prune_rounds(session, keep)
        except Exception:
            logger.exception("could not store the scheduling round")

    def expire_code(self, now: datetime) -> int:
        """Delete the code archives past their retention (`code_retention_seconds`)."""
        with transaction(self._factory) as session:
            expired = code_models.expire(session, now, self._settings.code_retention_seconds)
        if expired:
            logger.info("deleted %d code archive(s) past their retention", expired)
        return expired

    def run_round(self, now: datetime | None = None) -> RoundResult:
        now = now or utcnow()
        started = time.perf_counter()
        self._conflicts = 0
        self._decisions = []
        if self._leading_since is None:
            self._leading_since = now
        reports = self._dispatcher.poll(now)
        finished = self._ingest(reports, now)
        relaunched = self._relaunch_resized(now)
        self._measure_resizes(now)
        self._measure_starts()
        agents_lost, requeued = self._expire_agents(now)
        released = self._release_ended(now)
        requeued += self._reconcile(now)
        requeued += self._requeue_drained()
        with transaction(self._factory) as session:
            lowered = self._lower_caps(session)
            snapshot = build_snapshot(session, now)
            quotas = queue_models.quotas(session)
        self._send_caps(lowered)
        plan, decision = schedule_within(self._policy, quotas, snapshot)
        plan = self._checked(plan, snapshot)
        if self._telemetry is not None:
            self._telemetry.observe_quotas(snapshot, plan, decision, quotas)
        suspended, stopped = self._end_runs(plan, now)
        # After the suspensions and stops went out: their GPUs are being given back.
        ready, held_back = self._held_back(plan, snapshot)
        self._explain_waits(snapshot, plan, decision, quotas, now, held_back)
        reconfigured = self._reconfigure(plan.reconfigure, now)
        self._ask_resizes(plan.resize, now)
        launched = self._start(ready, snapshot, now) + relaunched
        return RoundResult(
            started_at=now,
            reports=len(reports),
            finished=finished,
            agents_lost=agents_lost,
            requeued=requeued,
            released=released,
            started=launched,
            suspended=suspended,
            stopped=stopped,
            reconfigured=reconfigured,
            conflicts=self._conflicts,
            seconds=time.perf_counter() - started,
            decisions=tuple(self._decisions),
        )

    # -- 1. reports -----------------------------------------------------------------

    def _ingest(self, reports: list[Report], now: datetime) -> int:
        """Apply the reports together; when that fails, each on its own, and a report
        that still fails once more without what its job's code wrote (metrics, message):
        an exit that is never recorded would leave its job RUNNING without processes,
        to be requeued and relaunched over and over."""
        if not reports:
            return 0
        try:
            ended = self._apply(reports, now)
        except Exception:
            logger.exception("could not apply %d reports together; one by one", len(reports))
            ended = []
            for report in reports:
                for attempt in (report, _bare(report)):
                    try:
                        ended += self._apply([attempt], now)
                        break
                    except Exception:
                        logger.exception(
                            "could not apply the report of job %d",
                            report.job_id,
                            extra={"job_id": report.job_id},
                        )
        # A gang whose ranks on one node crashed must not wait on them forever elsewhere.
        self._command(self._dispatcher.stop, ended)
        return len(ended)

    def _apply(self, reports: list[Report], now: datetime) -> list[int]:
        """Apply the reports in one transaction; the jobs that left RUNNING. Raises when
        it rolled back, having forgotten what it decided."""
        decided, conflicts = len(self._decisions), self._conflicts
        try:
            return self._apply_in_transaction(reports, now)
        except Exception:
            del self._decisions[decided:]
            self._conflicts = conflicts
            raise

    def _apply_in_transaction(self, reports: list[Report], now: datetime) -> list[int]:
        ended: list[int] = []
        with transaction(self._factory) as session:
            jobs = job_models.by_id(session, (report.job_id for report in reports))
            for report in reports:
                job = jobs.get(report.job_id)
                # Reports of jobs no longer running (cancelled, requeued) are stale; so are
                # the exits of processes the scheduler itself suspended or stopped.
                if job is None or job.state != JobState.RUNNING:
                    continue
                job.iterations_done = max(job.iterations_done, report.iterations_done)
                if report.outcome is RunOutcome.SHRUNK:
                    self._shrunk(session, job, report, now)
                    continue
                if report.metrics:
                    job.metrics = dict(report.metrics)
                if self._end(session, job, report):
                    ended.append(job.id)
            allocations.release(session, ended, now)
        return ended

    def _end(self, session: Session, job: Job, report: Report) -> bool:
        """Apply a run's end to a RUNNING job; True when the job left RUNNING."""
        if report.outcome is RunOutcome.SUCCEEDED:
            return self._transition(session, job, JobState.SUCCEEDED, report.message or "finished")
        if report.outcome is RunOutcome.FAILED:
            limit = int(job.spec.get("max_retries", 0))
            if job.failures < limit:
                job.failures += 1
                why = f"retry {job.failures} of {limit} after a crash: {report.message}"
                if not self._transition(session, job, JobState.QUEUED, _clip(why)):
                    return False
                self._decide(rounds.REQUEUE, job.id, reason="crash", retry=job.failures)
                return True
            return self._transition(session, job, JobState.FAILED, _clip(report.message))
        if report.outcome is RunOutcome.SUSPENDED and job.id in self._resizing:
            # Checkpointed for a resize: suspended (no policy places it, it is not
            # preempted) until every process is gone and the new gang is placed.
            return self._transition(
                session,
                job,
                JobState.SUSPENDED,
                "checkpointed for a resize",
                suspended_by=SuspendedBy.RESIZE,
            )
        if report.outcome is RunOutcome.REFUSED:
            # No room on a GPU the placement shared: not the job's fault, not a retry.
            if not self._transition(session, job, JobState.QUEUED, _clip(report.message)):
                return False
            self._decide(rounds.REQUEUE, job.id, reason="refused")
            return True
        if report.outcome in (RunOutcome.SUSPENDED, RunOutcome.STOPPED):
            # Nobody asked a RUNNING job to end: its processes went away on their own.
            if not self._transition(
                session, job, JobState.QUEUED, f"processes ended unasked ({report.outcome})"
            ):
                return False
            self._decide(rounds.REQUEUE, job.id, reason=f"processes ended ({report.outcome})")
            return True
        return False

    # -- 2. liveness ----------------------------------------------------------------

    def _expire_agents(self, now: datetime) -> tuple[int, int]:
        """Mark dead the agents silent for `agent_timeout_seconds` as this scheduler
        heard them, and requeue their jobs. Heartbeats sent while no scheduler led (a
        restart, a failover) reached nobody: an agent is first timed from this process's
        first round, as Kubernetes' node controller times nodes from its own start, so an
        outage longer than the timeout does not stop every job its agents still run."""
        cutoff = now - timedelta(seconds=self._settings.agent_timeout_seconds)
        assert self._leading_since is not None
        if cutoff < self._leading_since:
            return 0, 0
        with transaction(self._factory) as session:
            lost = agents.expire(session, cutoff, actor=ACTOR)
            if not lost:
                return 0, 0
            for agent in lost:
                self._decide(rounds.AGENT_LOST, None, agent_id=agent.agent_id, node=agent.node_name)
            jobs = allocations.holders_on_nodes(session, [agent.node_id for agent in lost])
            # The whole gang stops, not only the ranks on the lost node.
            allocations.release(session, [job.id for job in jobs], now)
            requeued = [
                job.id
                for job in jobs
                if job.state in _REQUEUE_FROM
                and self._transition(session, job, JobState.QUEUED, "agent lost")
            ]
            for job_id in requeued:
                self._decide(rounds.REQUEUE, job_id, reason="agent lost")
            logger.warning(
                "agents lost on nodes %s; requeued jobs %s",
                [agent.node_id for agent in lost],
                requeued,
                extra={"agent_ids": [agent.agent_id for agent in lost]},
            )
        # Only after the commit: a dispatcher must never act on a decision that rolled back.
        for agent in lost:
            if agent.node_name is not None:
                self._dispatcher.node_lost(agent.node_name)
        self._command(self._dispatcher.stop, [job.id for job in jobs])
        return len(lost), len(requeued)

    # -- 3. ended jobs and stray processes -------------------------------------------

    def _release_ended(self, now: datetime) -> int:
        """Free the GPUs of jobs that ended or were suspended outside the loop (the API)."""
        with transaction(self._factory) as session:
            ended = allocations.held_in(session, _RELEASED)
            allocations.release(session, ended, now)
        for job_id in ended:
            self._decide(rounds.RELEASE, job_id)
        return len(ended)

    def _reconcile(self, now: datetime) -> int:
        """Bring the processes the dispatcher knows of in line with the database.

        Processes of a job run where it is allocated while it is SCHEDULED or RUNNING;
        a SUSPENDED job's processes checkpoint and exit; anything else is stray (the job
        ended, was requeued, or its agent came back after being declared dead while the
        job moved elsewhere) and is stopped. Dispatchers send each command once.
        Conversely, a RUNNING job allocated on a connected node that runs none of its
        processes lost them (the agent restarted): it goes back to the queue.
        Returns how many jobs were requeued that way.
        """
        # Connected nodes first: a Hello landing between the two reads (an agent
        # redialling a new leader) then adds runs, never a node without its claims,
        # whose jobs would look orphaned and be relaunched.
        connected = self._dispatcher.connected()
        active = self._dispatcher.active()
        with transaction(self._factory) as session:
            placed = allocations.placed_nodes(session, active, connected)
            states = job_models.states(session, set(active) | set(placed))
            orphans = [
                job_id
                for job_id, nodes in placed.items()
                if states.get(job_id) == JobState.RUNNING
                and any(node in connected and node not in active.get(job_id, ()) for node in nodes)
            ]
            orphan_jobs = job_models.by_id(session, orphans)
            lost = [
                job_id
                for job_id in orphans
                if self._transition(
                    session,
                    orphan_jobs[job_id],
                    JobState.QUEUED,
                    "its processes are gone (agent restarted)",
                )
            ]
            allocations.release(session, lost, now)
        for job_id in lost:
            self._decide(rounds.REQUEUE, job_id, reason="processes gone")
        self._command(self._dispatcher.stop, lost)
        for job_id, nodes in active.items():
            job_state = states.get(job_id)
            if job_state == JobState.SUSPENDED:
                self._command(self._dispatcher.suspend, [job_id])
                continue
            for node in nodes:
                if job_state not in _PLACED or node not in placed.get(job_id, ()):
                    try:
                        self._dispatcher.stop(job_id, node)
                    except Exception:
                        logger.exception(
                            "stopping stray job %d on %s failed",
                            job_id,
                            node,
                            extra={"job_id": job_id},
                        )
        return len(lost)

    def _requeue_drained(self) -> int:
        """Queue again the jobs `jigsaw node drain --now` suspended, once their processes
        have checkpointed and exited, so that whatever the policy they are placed anew
        (off the drained node) and continue from the checkpoint. A new leader knows no
        process until agents redial: until every live agent has (or expired), a job's
        processes may still be checkpointing unseen, and requeued now, the job would
        run twice."""
        with transaction(self._factory) as session:
            drained = suspended_to_requeue(session)
            if not drained or self._dispatcher.unheard(agents.alive_node_names(session)):
                return 0  # none, or an agent that did not time out yet has not redialled
            active = self._dispatcher.active()
            requeued = [
                job.id
                for job in drained
                if job.id not in active
                and job.id not in self._resizing
                and self._transition(
                    session,
                    job,
                    JobState.QUEUED,
                    _REQUEUED_BECAUSE[str(job.suspended_by)],
                )
            ]
        for job_id in requeued:
            self._decide(rounds.REQUEUE, job_id, reason="node drained or resize orphaned")
        return len(requeued)

    # -- 4. the plan ----------------------------------------------------------------

    def _held_back(self, plan: Plan, snapshot: ClusterSnapshot) -> tuple[Plan, dict[int, Wait]]:
        """The plan without the starts on GPUs that the processes of a job suspended or
        stopped (this round or before) still hold, or of a job whose own earlier run's
        processes have not exited, and why each of those waits. The database freed
        those GPUs and that run; launching now would be refused, and the job would go
        back and forth between SCHEDULED and QUEUED until the processes exit (as long as
        a checkpoint takes to write). It stays QUEUED instead.

        Likewise, while a live agent has not said what it runs to this scheduler (a
        leader that took over moments ago), no job starts on its node, nor a job that
        ran before (its earlier run's processes may still be checkpointing there)."""
        freeing = self._dispatcher.freeing()
        exiting = self._dispatcher.active().keys()
        unheard = self._dispatcher.unheard(node.name for node in snapshot.nodes if node.alive)
        if not freeing and not exiting and not unheard:
            return plan, {}
        gpus = snapshot.gpus_by_id()
        ran = {job.id for job in snapshot.jobs if job.attained_gpu_seconds > 0}
        ready, waits = [], {}
        for placement in plan.start:
            held = [
                f"{gpus[gpu_id].node_name}:{gpus[gpu_id].index}"
                for gpu_id in placement.gpu_ids
                if (gpus[gpu_id].node_name, gpus[gpu_id].index) in freeing
            ]
            onto = {gpus[gpu_id].node_name for gpu_id in placement.gpu_ids}
            if held:
                waits[placement.job_id] = freeing_reason(held)
            elif placement.job_id in exiting:
                waits[placement.job_id] = exiting_reason()
            elif unheard and (onto & unheard or placement.job_id in ran):
                waits[placement.job_id] = unheard_reason(sorted(unheard))
            else:
                ready.append(placement)
        return replace(plan, start=tuple(ready)), waits

    def _explain_waits(
        self,
        snapshot: ClusterSnapshot,
        plan: Plan,
        decision: QuotaDecision | None,
        quotas: Quotas,
        now: datetime,
        held_back: Mapping[int, Wait],
    ) -> None:
        """Give every waiting job the plan does not start its reason (`scheduler.core.
        waits`: no capacity can ever hold it, its queue has no room, too few GPUs free,
        jobs ahead of it; placed on GPUs still being given back: `held_back`), shown by
        the API, CLI and dashboard; a transition clears it."""
        waits = {**explain(snapshot, plan, decision, quotas, self._policy_name), **held_back}
        reasons = {job_id: wait.text for job_id, wait in waits.items()}
        starts = estimated_starts(snapshot, plan, decision, self._policy_name)
        with transaction(self._factory) as session:
            changed = job_models.set_pending_reasons(session, reasons, actor=ACTOR, now=now)
            job_models.set_estimated_starts(session, starts)
        for job_id in changed:
            if job_id in waits and waits[job_id].kind == UNPLACEABLE:
                self._decide(rounds.UNPLACEABLE, job_id, reason=reasons[job_id])

    def _checked(self, plan: Plan, snapshot: ClusterSnapshot) -> Plan:
        """The plan without the items the validator refuses, each logged with its
        reason and counted as a conflict: one bad item must not cost the round."""
        checked = validate(plan, snapshot)
        for rejection in checked.rejected:
            logger.info(
                "policy %s: %s of job %d refused: %s",
                self._policy_name,
                rejection.action,
                rejection.job_id,
                rejection.reason,
                extra={"job_id": rejection.job_id},
            )
            self._conflicts += 1
        return checked.plan

    def _end_runs(self, plan: Plan, now: datetime) -> tuple[int, int]:
        """Suspend and stop what the policy asked, releasing those jobs' GPUs."""
        suspended = self._end_each(plan.suspend, JobState.SUSPENDED, "suspended by policy", now)
        for job_id in suspended:
            self._decide(rounds.SUSPEND, job_id)
        self._command(self._dispatcher.suspend, suspended)
        stopped = self._end_each(plan.stop, JobState.FAILED, "stopped by policy", now)
        for job_id in stopped:
            self._decide(rounds.STOP, job_id)
        self._command(self._dispatcher.stop, stopped)
        return len(suspended), len(stopped)

    def _end_each(
        self, job_ids: Iterable[int], target: JobState, message: str, now: datetime
    ) -> list[int]:
        done = []
        for job_id in job_ids:
            with transaction(self._factory) as session:
                job = job_models.get(session, job_id)
                if job is not None and self._transition(session, job, target, message):
                    allocations.release(session, [job_id], now)
                    done.append(job_id)
        return done

    def _reconfigure(self, changes: Iterable[Reconfigure], now: datetime) -> int:
        """Give running jobs their new SPB configuration: recorded, then dispatched.

        Only a RUNNING job whose configuration differs changes; its allocations take the
        configuration and the next version, with a `reconfigure` event, in one
        transaction. The agents hear of it after the commit and apply it at the job's
        next lease boundary.
        """
        done = 0
        for change in changes:
            with transaction(self._factory) as session:
                job = job_models.get(session, change.job_id)
                try:
                    if job is None or job.state != JobState.RUNNING:
                        raise LookupError(f"job {change.job_id} is not running")
                    version = allocations.reconfigure(
                        session, job, change.spb, actor=ACTOR, policy=self._policy_name, now=now
                    )
                except LookupError:
                    logger.info("not reconfiguring job %d: not running", change.job_id)
                    self._conflicts += 1
                    continue
                if version is None:
                    continue
            self._decide(
                rounds.RECONFIGURE,
                change.job_id,
                spb=dict(change.spb),
                config_version=version,
                iteration=job.iterations_done,
            )
            try:
                self._dispatcher.reconfigure(change.job_id, version, dict(change.spb))
            except Exception:
                logger.exception("dispatching reconfigure for job %d failed", change.job_id)
            done += 1
        return done

    def _lower_caps(self, session: Session) -> dict[int, int]:
        """Lower the memory cap of running jobs that need at most half of it
        (`agents.caps_to_lower`), in the round's snapshot transaction so that the plan
        sees the room; `_send_caps` tells their agents once it is committed."""
        lowered = agents.caps_to_lower(
            session,
            headroom=agents.LOWERED_CAP_HEADROOM,
            settle=_CAP_SETTLE_ITERATIONS,
            recent=agents.MEMORY_RECENT_ITERATIONS,
        )
        for job_id, memory_bytes in lowered.items():
            agents.lower_cap(session, job_id, memory_bytes)
        return lowered

    def _send_caps(self, lowered: Mapping[int, int]) -> None:
        for job_id, memory_bytes in lowered.items():
            self._decide(rounds.CAP, job_id, memory_bytes=memory_bytes)
            try:
                self._dispatcher.cap(job_id, memory_bytes)
            except Exception:
                logger.exception("dispatching the memory cap of job %d failed", job_id)

    def _start(self, plan: Plan, snapshot: ClusterSnapshot, now: datetime) -> int:
        gpus = snapshot.gpus_by_id()
        addresses = {node.id: node.address for node in snapshot.nodes}
        jobs = {job.id: job for job in snapshot.jobs}
        running = 0
        for placement in plan.start:
            job = jobs[placement.job_id]
            workers = tuple(
                Worker(
                    rank,
                    gpu_id,
                    gpus[gpu_id].node_id,
                    gpus[gpu_id].node_name,
                    gpus[gpu_id].index,
                    addresses[gpus[gpu_id].node_id],
                )
                for rank, gpu_id in enumerate(placement.gpu_ids)
            )
            allocated = self._allocate(placement, workers, now)
            if allocated is None:
                continue
            attempt, spec = allocated
            launch = Launch(
                job_id=job.id,
                spec=spec,
                workers=workers,
                spb=placement.spb,
                start_iteration=job.iterations_done,
                lease_iterations=self._settings.lease_iterations,
                attempt=attempt,
                global_batch=placement.global_batch,
                memory_bytes=_profiled_cap(job, [gpus[g] for g in placement.gpu_ids]),
            )
            if self._launch(launch, now):
                self._starting[job.id] = job.iterations_done + 1
                running += 1
        return running

    def _launch(self, launch: Launch, now: datetime) -> bool:
        """Dispatch a SCHEDULED job: RUNNING once acknowledged, else back to the queue."""
        try:
            acknowledged = self._dispatcher.launch(launch)
        except Exception:
            logger.exception(
                "launching job %d failed", launch.job_id, extra={"job_id": launch.job_id}
            )
            acknowledged = False
        with transaction(self._factory) as session:
            job = job_models.get(session, launch.job_id)
            if job is None:  # deleted meanwhile; its allocations went with it
                return False
            if acknowledged:
                return self._transition(session, job, JobState.RUNNING, "launched")
            if job.attempts == launch.attempt:
                # Refused before any command left (the dispatcher checks all first): no
                # agent knows this attempt, so the next placement may carry it.
                job.attempts -= 1
            if self._transition(session, job, JobState.QUEUED, "launch refused"):
                allocations.release(session, [job.id], now)
                self._decide(rounds.LAUNCH_REFUSED, job.id)
            return False

    def _allocate(
        self, placement: Placement, workers: tuple[Worker, ...], now: datetime
    ) -> tuple[int, dict[str, Any]] | None:
        """QUEUED -> SCHEDULED with its allocations and a decision event, atomically;
        the placement's attempt and the job's spec, or None when it could not be placed.

        The attempt is counted here, before the launch is sent, so that no two launches
        that reached an agent ever carry the same one. Refused when a node was drained
        since the snapshot.
        """
        with transaction(self._factory) as session:
            if on_drained_node(session, list(placement.gpu_ids)):
                self._conflicts += 1
                return None
            job = job_models.get(session, placement.job_id)
            if job is None or not self._transition(
                session, job, JobState.SCHEDULED, f"placed by {self._policy_name}"
            ):
                return None
            lease = allocations.Lease(
                placement.gpu_ids,
                tuple(worker.node_name for worker in workers),
                placement.spb,
                self._settings.lease_iterations,
            )
            attempt = allocations.lease(
                session, job, lease, actor=ACTOR, policy=self._policy_name, now=now
            )
            self._decide(
                rounds.LEASE,
                job.id,
                gpus=len(workers),
                nodes=sorted({worker.node_name for worker in workers}),
                spb=placement.spb,
                start_iteration=job.iterations_done,
                lease_iterations=self._settings.lease_iterations,
                attempt=attempt,
            )
        return attempt, dict(job.spec)

    # -- resizes (scheduler/resize.py) ------------------------------------------------

    def _ask_resizes(self, resizes: Iterable[Resize], now: datetime) -> None:
        """Ask each running job resized to shrink, grow (onto GPUs it is then given) or,
        an adaptive one, change its batch in place at its next boundary where it can
        (`scheduler.resize.in_place`), else to checkpoint there for a restart."""
        for resize in resizes:
            # One at a time: the next once the last one's new gang has reported (its
            # cost measured), so that a rebatch is not asked again before the job
            # reports the batch it made.
            if resize.job_id in self._resizing or resize.job_id in self._measuring:
                continue
            with transaction(self._factory) as session:
                job = session.get(Job, resize.job_id)
                attempt, gang = resize_models.gang(session, resize.job_id)
                why = (
                    "not running"
                    if job is None or job.state != JobState.RUNNING
                    else resize_refusal(job.spec, len(gang), resize)
                )
                if why is not None or job is None:
                    logger.info("not resizing job %d: %s", resize.job_id, why)
                    self._conflicts += 1
                    continue
                resize_models.record_asked(
                    session, job.id, resize.gpu_ids, len(gang), actor=ACTOR, now=now
                )
                after = (
                    self._in_place(session, gang, resize)
                    if self._settings.resize_in_place
                    else None
                )
                if after is not None:
                    resize_models.hold(session, job.id, after[len(gang) :], now)
                launch = (
                    Launch(
                        job_id=job.id,
                        spec=dict(job.spec),
                        workers=after,
                        spb={},
                        start_iteration=job.iterations_done,
                        lease_iterations=self._settings.lease_iterations,
                        attempt=attempt,
                        global_batch=resize.global_batch,
                    )
                    if after is not None
                    else None
                )
            pending = PendingResize(resize, from_workers=len(gang))
            if launch is not None and self._asked_in_place(launch):
                kept = tuple(worker.gpu_id for worker in launch.workers)
                pending = replace(pending, resize=replace(resize, gpu_ids=kept), mechanism=IN_PLACE)
            else:
                self._command(self._dispatcher.suspend, [resize.job_id])
            self._resizing[resize.job_id] = pending
            self._decide(
                rounds.RESIZE,
                resize.job_id,
                gpus=len(resize.gpu_ids),
                held=len(gang),
                mechanism=pending.mechanism,
            )

    @staticmethod
    def _in_place(
        session: Session, gang: tuple[Worker, ...], resize: Resize
    ) -> tuple[Worker, ...] | None:
        """The gang `resize` leaves when done in place, a growth's GPUs free; else None."""
        held = {worker.gpu_id for worker in gang}
        added = [gpu_id for gpu_id in resize.gpu_ids if gpu_id not in held]
        joiners = resize_models.free_workers(session, added) if added else ()
        return in_place(gang, resize, joiners) if joiners is not None else None

    def _asked_in_place(self, launch: Launch) -> bool:
        """Whether the dispatcher asked the job to resize in place."""
        try:
            return self._dispatcher.resize_in_place(launch)
        except Exception:
            logger.exception(
                "asking job %d to resize in place failed: resizing it by a restart",
                launch.job_id,
                extra={"job_id": launch.job_id},
            )
            return False

    def _shrunk(self, session: Session, job: Job, report: Report, now: datetime) -> None:
        """Apply an in-place resize: the GPUs left are free (a growth's were held from
        the ask), and the cost of one this leader asked is measured once the new gang
        reports (`_measure_resizes`)."""
        changed = resize_models.shrink(session, job.id, report.node, report.ranks, now)
        pending = self._resizing.pop(job.id, None)
        if changed is None:
            logger.warning(
                "job %d: shrink to GPUs %s of %s is not of the GPUs it holds: ignored",
                job.id,
                list(report.ranks),
                report.node,
                extra={"job_id": job.id},
            )
            return
        held, kept = changed
        if pending is not None:  # asked by this leader: its boundary is known
            self._measuring[job.id] = PendingResize(
                replace(pending.resize, gpu_ids=kept),
                pending.from_workers,
                report.iterations_done,
                IN_PLACE,
            )

    def _relaunch_resized(self, now: datetime) -> int:
        """Place the jobs that checkpointed for a resize on their new gang, once all their
        processes are gone; a job whose new GPUs were taken stays queued for the policy."""
        active = self._dispatcher.active()
        launched = 0
        for job_id, pending in list(self._resizing.items()):
            with transaction(self._factory) as session:
                job = session.get(Job, job_id)
                if job is not None and (job.state == JobState.RUNNING or job_id in active):
                    continue  # not at its boundary yet
                checkpointed = (
                    job is not None
                    and job.state == JobState.SUSPENDED
                    and job.suspended_by == SuspendedBy.RESIZE
                )
                workers = (
                    resize_models.free_workers(session, pending.resize.gpu_ids)
                    if checkpointed
                    else None
                )
                if checkpointed and workers is None and job is not None:
                    self._transition(session, job, JobState.QUEUED, "resize abandoned: GPUs taken")
                iteration = job.iterations_done if job is not None else 0
            del self._resizing[job_id]
            if workers is None:
                logger.info("job %d not resized: it ended, or its new GPUs are taken", job_id)
                continue
            placement = Placement(
                job_id, pending.resize.gpu_ids, global_batch=pending.resize.global_batch
            )
            allocated = self._allocate(placement, workers, now)
            if allocated is None:
                continue
            attempt, spec = allocated
            launch = Launch(
                job_id=job_id,
                spec=spec,
                workers=workers,
                spb={},
                start_iteration=iteration,
                lease_iterations=self._settings.lease_iterations,
                attempt=attempt,
                global_batch=pending.resize.global_batch,
            )
            if self._launch(launch, now):
                self._measuring[job_id] = replace(pending, boundary=iteration, mechanism=RESTART)
                launched += 1
        return launched

    def _measure_resizes(self, now: datetime) -> None:
        """Store each relaunched job's resize cost once its new gang has reported."""
        for job_id, pending in list(self._measuring.items()):
            with transaction(self._factory) as session:
                job = session.get(Job, job_id)
                if job is None or job.state != JobState.RUNNING:
                    del self._measuring[job_id]
                    continue
                seconds = resize_models.resize_seconds(session, job_id, pending.boundary)
                if seconds is None:
                    continue
                details = {
                    "from_workers": pending.from_workers,
                    "to_workers": len(pending.resize.gpu_ids),
                    "iteration": pending.boundary,
                    "seconds": seconds,
                    "global_batch": pending.resize.global_batch or None,
                    "mechanism": pending.mechanism,
                }
                resize_models.record_resized(session, job_id, details, actor=ACTOR, now=now)
            del self._measuring[job_id]
            self._decide(rounds.RESIZED, job_id, **details)

    def _measure_starts(self) -> None:
        """Store what each launched job's start cost once its first iteration is in (one
        transaction for all: a round launches many on a busy cluster)."""
        if not self._starting:
            return
        with transaction(self._factory) as session:
            running = job_models.states(session, set(self._starting))
            for job_id, first in list(self._starting.items()):
                if running.get(job_id) == JobState.RUNNING:
                    seconds = start_models.start_seconds(session, job_id, first)
                    if seconds is None:
                        continue
                    start_models.record_started(session, job_id, first, seconds, actor=ACTOR)
                del self._starting[job_id]

    # -- helpers --------------------------------------------------------------------

    def _decide(self, kind: str, job_id: int | None, **detail: Any) -> None:
        """Note a decision of this round (stored with the round, counted by kind)."""
        self._decisions.append(Decision(kind, job_id, detail))
        logger.info("decision %s", kind, extra={"job_id": job_id, "decision": detail})

    def _transition(
        self,
        session: Session,
        job: Job,
        target: JobState,
        message: str,
        suspended_by: SuspendedBy = SuspendedBy.POLICY,
    ) -> bool:
        """Transition, or log and count a lost race (the API changed the job meanwhile).

        `transition` writes nothing when it raises, so the surrounding transaction stays
        usable for the other jobs of the round.
        """
        try:
            # The loop suspends a job when its policy says so, or to resize it.
            transition(
                session,
                job,
                target,
                actor=ACTOR,
                message=message,
                suspended_by=suspended_by,
            )
        except IllegalTransition as exc:
            logger.info("skipping job %d this round: %s", job.id, exc, extra={"job_id": job.id})
            self._conflicts += 1
            return False
        return True

    @staticmethod
    def _command(command: Callable[[int], None], job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            try:
                command(job_id)
            except Exception:
                # The decision is committed and must stand; the log names the job whose
                # workers may still be running, and their stale reports are ignored.
                logger.exception(
                    "dispatching %s for job %d failed",
                    command.__name__,
                    job_id,
                    extra={"job_id": job_id},
                )


def _bare(report: Report) -> Report:
    """The report without what the job's own code wrote."""
    return replace(report, metrics={}, message=f"{report.outcome} (its message was unstorable)")


def _clip(message: str) -> str:
    """A long message's start (what happened) and end (a traceback's last lines say why)."""
    if len(message) <= _MESSAGE_CHARS:
        return message
    head = _MESSAGE_CHARS // 10
    return f"{message[:head]} ... {message[-(_MESSAGE_CHARS - head - 5) :]}"


def _profiled_cap(job: JobView, gpus: Iterable[GPUView]) -> int | None:
    """The memory cap of a job that has not reported, as the model its profile gave it
    puts it (so it can share a GPU from its first placement); None: the dispatcher caps
    it by what it reported, or gives it the whole GPU."""
    if job.iterations_done or job.model is None:
        return None
    return min([job.model.memory_bytes, *(gpu.memory_bytes for gpu in gpus)])
