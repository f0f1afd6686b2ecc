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
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from scheduler import rounds
from scheduler.core.quota import QuotaDecision, Quotas, schedule_within
from scheduler.core.waits import UNPLACEABLE, estimated_starts, explain
from scheduler.db import transaction
from scheduler.dispatch import Dispatcher, Launch, Report, RunOutcome, Worker
from scheduler.models import jobs as job_models
from scheduler.models import queues as queue_models
from scheduler.models.nodes import DRAINED_MESSAGE, on_drained_node
from scheduler.models.rounds import prune_rounds, record_round
from scheduler.orm import GPU, Agent, Allocation, Event, Job, Node, utcnow
from scheduler.plan import Placement, Plan, Reconfigure
from scheduler.policies import get_policy
from scheduler.rounds import Decision, RoundResult
from scheduler.settings import SchedulerSettings
from scheduler.snapshot import PREEMPTED_MESSAGE, ClusterSnapshot, build_snapshot
from scheduler.states import TERMINAL, IllegalTransition, JobState, transition
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
# A job's message holds the end of an error, not a whole log.
_MESSAGE_CHARS = 4000
# Stored rounds are pruned to JIGSAW_SCHEDULER_ROUNDS_KEPT once every this many rounds.
_PRUNE_EVERY = 100


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

    def run_round(self, now: datetime | None = None) -> RoundResult:
        now = now or utcnow()
        started = time.perf_counter()
        self._conflicts = 0
        self._decisions = []
        reports = self._dispatcher.poll(now)
        finished = self._ingest(reports, now)
        agents_lost, requeued = self._expire_agents(now)
        released = self._release_ended(now)
        requeued += self._reconcile(now)
        requeued += self._requeue_drained()
        with transaction(self._factory) as session:
            snapshot = build_snapshot(session, now)
            quotas = queue_models.quotas(session)
        plan, decision = schedule_within(self._policy, quotas, snapshot)
        self._explain_waits(snapshot, plan, decision, quotas, now)
        if self._telemetry is not None:
            self._telemetry.observe_quotas(snapshot, plan, decision, quotas)
        suspended, stopped = self._end_runs(plan, now)
        reconfigured = self._reconfigure(plan.reconfigure, now)
        launched = self._start(plan, snapshot, now)
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
            jobs = {
                job.id: job
                for job in session.scalars(
                    select(Job).where(Job.id.in_({report.job_id for report in reports}))
                )
            }
            for report in reports:
                job = jobs.get(report.job_id)
                # Reports of jobs no longer running (cancelled, requeued) are stale; so are
                # the exits of processes the scheduler itself suspended or stopped.
                if job is None or job.state != JobState.RUNNING:
                    continue
                job.iterations_done = max(job.iterations_done, report.iterations_done)
                if report.metrics:
                    job.metrics = dict(report.metrics)
                if self._end(session, job, report):
                    ended.append(job.id)
            _release(session, ended, now)
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
        cutoff = now - timedelta(seconds=self._settings.agent_timeout_seconds)
        with transaction(self._factory) as session:
            lost = session.scalars(
                select(Agent).where(Agent.alive.is_(True), Agent.last_heartbeat_at < cutoff)
            ).all()
            if not lost:
                return 0, 0
            names = {
                node_id: name
                for node_id, name in session.execute(
                    select(Node.id, Node.name).where(Node.id.in_([a.node_id for a in lost]))
                )
            }
            lost_names = list(names.values())
            for agent in lost:
                agent.alive = False
                self._decide(
                    rounds.AGENT_LOST, None, agent_id=agent.id, node=names.get(agent.node_id)
                )
                session.add(
                    Event(
                        kind="agent_lost",
                        actor=ACTOR,
                        message=f"no heartbeat since {agent.last_heartbeat_at.isoformat()}",
                        data={"agent_id": agent.id, "node_id": agent.node_id},
                    )
                )
            # A subquery, not DISTINCT over jobs: PostgreSQL cannot compare JSON columns.
            holding = (
                select(Allocation.job_id)
                .join(GPU, GPU.id == Allocation.gpu_id)
                .where(
                    GPU.node_id.in_([agent.node_id for agent in lost]),
                    Allocation.released_at.is_(None),
                )
            )
            jobs = session.scalars(select(Job).where(Job.id.in_(holding))).all()
            # The whole gang stops, not only the ranks on the lost node.
            _release(session, [job.id for job in jobs], now)
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
                extra={"agent_ids": [agent.id for agent in lost]},
            )
        # Only after the commit: a dispatcher must never act on a decision that rolled back.
        for name in lost_names:
            self._dispatcher.node_lost(name)
        self._command(self._dispatcher.stop, [job.id for job in jobs])
        return len(lost), len(requeued)

    # -- 3. ended jobs and stray processes -------------------------------------------

    def _release_ended(self, now: datetime) -> int:
        """Free the GPUs of jobs that ended or were suspended outside the loop (the API)."""
        with transaction(self._factory) as session:
            ended = session.scalars(
                select(Allocation.job_id)
                .join(Job, Job.id == Allocation.job_id)
                .where(
                    Allocation.released_at.is_(None),
                    Job.state.in_([state.value for state in _RELEASED]),
                )
                .distinct()
            ).all()
            _release(session, ended, now)
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
        active = self._dispatcher.active()
        connected = self._dispatcher.connected()
        with transaction(self._factory) as session:
            placed: dict[int, set[str]] = {}
            for job_id, node_name in session.execute(
                select(Allocation.job_id, Node.name)
                .join(GPU, GPU.id == Allocation.gpu_id)
                .join(Node, Node.id == GPU.node_id)
                .where(
                    Allocation.released_at.is_(None),
                    Allocation.job_id.in_(active) | Node.name.in_(connected),
                )
            ):
                placed.setdefault(job_id, set()).add(node_name)
            states = dict(
                session.execute(
                    select(Job.id, Job.state).where(Job.id.in_(set(active) | set(placed)))
                ).all()
            )
            orphans = [
                job_id
                for job_id, nodes in placed.items()
                if states.get(job_id) == JobState.RUNNING
                and any(node in connected and node not in active.get(job_id, ()) for node in nodes)
            ]
            lost = [
                job_id
                for job_id in orphans
                if self._transition(
                    session,
                    session.get_one(Job, job_id),
                    JobState.QUEUED,
                    "its processes are gone (agent restarted)",
                )
            ]
            _release(session, lost, now)
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
        (off the drained node) and continue from the checkpoint."""
        active = self._dispatcher.active()
        with transaction(self._factory) as session:
            drained = session.scalars(
                select(Job).where(Job.state == JobState.SUSPENDED, Job.message == DRAINED_MESSAGE)
            ).all()
            requeued = [
                job.id
                for job in drained
                if job.id not in active
                and self._transition(session, job, JobState.QUEUED, "its node was drained")
            ]
        for job_id in requeued:
            self._decide(rounds.REQUEUE, job_id, reason="node drained")
        return len(requeued)

    # -- 4. the plan ----------------------------------------------------------------

    def _explain_waits(
        self,
        snapshot: ClusterSnapshot,
        plan: Plan,
        decision: QuotaDecision | None,
        quotas: Quotas,
        now: datetime,
    ) -> None:
        """Give every waiting job the plan does not start its reason (`scheduler.core.
        waits`: no capacity can ever hold it, its queue has no room, too few GPUs free,
        jobs ahead of it), shown by the API, CLI and dashboard; a transition clears it."""
        waits = explain(snapshot, plan, decision, quotas, self._policy_name)
        reasons = {job_id: wait.text for job_id, wait in waits.items()}
        starts = estimated_starts(snapshot, plan, decision, self._policy_name)
        with transaction(self._factory) as session:
            changed = job_models.set_pending_reasons(session, reasons, actor=ACTOR, now=now)
            job_models.set_estimated_starts(session, starts)
        for job_id in changed:
            if job_id in waits and waits[job_id].kind == UNPLACEABLE:
                self._decide(rounds.UNPLACEABLE, job_id, reason=reasons[job_id])

    def _end_runs(self, plan: Plan, now: datetime) -> tuple[int, int]:
        """Suspend and stop what the policy asked, releasing those jobs' GPUs."""
        suspended = self._end_each(plan.suspend, JobState.SUSPENDED, PREEMPTED_MESSAGE, now)
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
                job = session.get(Job, job_id)
                if job is not None and self._transition(session, job, target, message):
                    _release(session, [job_id], now)
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
                job = session.get(Job, change.job_id)
                held = session.scalars(
                    select(Allocation).where(
                        Allocation.job_id == change.job_id, Allocation.released_at.is_(None)
                    )
                ).all()
                if job is None or job.state != JobState.RUNNING or not held:
                    logger.info("not reconfiguring job %d: not running", change.job_id)
                    self._conflicts += 1
                    continue
                if all(allocation.spb == change.spb for allocation in held):
                    continue
                version = max(allocation.config_version for allocation in held) + 1
                for allocation in held:
                    allocation.spb = dict(change.spb)
                    allocation.config_version = version
                session.add(
                    Event(
                        job_id=job.id,
                        kind="reconfigure",
                        actor=ACTOR,
                        message=f"SPB {change.spb or 'off'} from iteration {job.iterations_done}",
                        data={
                            "policy": self._policy_name,
                            "spb": change.spb,
                            "config_version": version,
                            "iteration": job.iterations_done,
                        },
                        created_at=now,
                    )
                )
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

    def _start(self, plan: Plan, snapshot: ClusterSnapshot, now: datetime) -> int:
        gpus = snapshot.gpus_by_id()
        jobs = {job.id: job for job in snapshot.jobs}
        running = 0
        for placement in plan.start:
            job = jobs[placement.job_id]
            workers = tuple(
                Worker(
                    rank, gpu_id, gpus[gpu_id].node_id, gpus[gpu_id].node_name, gpus[gpu_id].index
                )
                for rank, gpu_id in enumerate(placement.gpu_ids)
            )
            attempt = self._allocate(placement, workers, now)
            if attempt is None:
                continue
            launch = Launch(
                job_id=job.id,
                spec=job.spec,
                workers=workers,
                spb=placement.spb,
                start_iteration=job.iterations_done,
                lease_iterations=self._settings.lease_iterations,
                attempt=attempt,
            )
            running += self._launch(launch, now)
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
            job = session.get(Job, launch.job_id)
            if job is None:  # deleted meanwhile; its allocations went with it
                return False
            if acknowledged:
                return self._transition(session, job, JobState.RUNNING, "launched")
            if job.attempts == launch.attempt:
                # Refused before any command left (the dispatcher checks all first): no
                # agent knows this attempt, so the next placement may carry it.
                job.attempts -= 1
            if self._transition(session, job, JobState.QUEUED, "launch refused"):
                _release(session, [job.id], now)
                self._decide(rounds.LAUNCH_REFUSED, job.id)
            return False

    def _allocate(
        self, placement: Placement, workers: tuple[Worker, ...], now: datetime
    ) -> int | None:
        """QUEUED -> SCHEDULED with its allocations and a decision event, atomically;
        the placement's attempt, or None when the job could not be placed.

        The attempt is counted here, before the launch is sent, so that no two launches
        that reached an agent ever carry the same one. Refused when a node was drained
        since the snapshot.
        """
        with transaction(self._factory) as session:
            if on_drained_node(session, list(placement.gpu_ids)):
                self._conflicts += 1
                return None
            job = session.get(Job, placement.job_id)
            if job is None or not self._transition(
                session, job, JobState.SCHEDULED, f"placed by {self._policy_name}"
            ):
                return None
            job.attempts += 1
            attempt = job.attempts
            session.add_all(
                Allocation(
                    job_id=job.id,
                    gpu_id=gpu_id,
                    rank=rank,
                    spb=placement.spb,
                    lease_start_iteration=job.iterations_done,
                    lease_iterations=self._settings.lease_iterations,
                    attempt=attempt,
                    created_at=now,
                )
                for rank, gpu_id in enumerate(placement.gpu_ids)
            )
            session.add(
                Event(
                    job_id=job.id,
                    kind="decision",
                    actor=ACTOR,
                    message=f"{len(workers)} GPU(s) on {sorted({w.node_name for w in workers})}",
                    data={
                        "policy": self._policy_name,
                        "gpu_ids": list(placement.gpu_ids),
                        "nodes": [worker.node_name for worker in workers],
                        "spb": placement.spb,
                    },
                )
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
        return attempt

    # -- helpers --------------------------------------------------------------------

    def _decide(self, kind: str, job_id: int | None, **detail: Any) -> None:
        """Note a decision of this round (stored with the round, counted by kind)."""
        self._decisions.append(Decision(kind, job_id, detail))
        logger.info("decision %s", kind, extra={"job_id": job_id, "decision": detail})

    def _transition(self, session: Session, job: Job, target: JobState, message: str) -> bool:
        """Transition, or log and count a lost race (the API changed the job meanwhile).

        `transition` writes nothing when it raises, so the surrounding transaction stays
        usable for the other jobs of the round.
        """
        try:
            transition(session, job, target, actor=ACTOR, message=message)
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


def _release(session: Session, job_ids: Iterable[int], now: datetime) -> None:
    """End every active allocation of these jobs."""
    ids = list(job_ids)
    if ids:
        session.execute(
            update(Allocation)
            .where(Allocation.job_id.in_(ids), Allocation.released_at.is_(None))
            .values(released_at=now)
            .execution_options(synchronize_session=False)
        )
