"""Prometheus metrics of the scheduler side: rounds, decisions, leadership, reports.

They live on the registry `/metrics` serves (`api.observability`), one per process:
every replica exports them, and only the leader's move, so a dashboard sums over pods.
Labels are bounded: a decision kind, an outcome or a queue, never a job or agent id.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.core.plan import Plan
from scheduler.core.quota import QuotaDecision, Quotas, queue_of
from scheduler.core.rounds import RoundResult
from scheduler.core.snapshot import ClusterSnapshot

# Rounds take milliseconds on a small cluster and up to seconds on a very large one.
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Jobs wait from seconds on an idle cluster to days on a busy one.
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)


class SchedulerTelemetry:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.round_seconds = Histogram(
            "jigsaw_scheduler_round_seconds",
            "Duration of a scheduling round.",
            buckets=ROUND_BUCKETS,
            registry=registry,
        )
        self.rounds = Counter(
            "jigsaw_scheduler_rounds_total",
            "Scheduling rounds run, by outcome (ok or error).",
            ("outcome",),
            registry=registry,
        )
        self.decisions = Counter(
            "jigsaw_scheduler_decisions_total",
            "Scheduler decisions (lease, suspend, requeue, pack, reconfigure, ...), by kind.",
            ("kind",),
            registry=registry,
        )
        self.leader = Gauge(
            "jigsaw_scheduler_leader",
            "1 while this process holds the scheduler leader lock, else 0.",
            registry=registry,
        )
        self.reports = Counter(
            "jigsaw_reports_ingested_total",
            "What agents reported and the scheduler stored, by kind (iterations, logs, "
            "evaluations, heartbeats).",
            ("kind",),
            registry=registry,
        )
        self.reports_dropped = Counter(
            "jigsaw_reports_dropped_total",
            "What agents reported and the scheduler did not store, by reason: "
            "write_failed (the database write failed), not_allocated (about a job not "
            "allocated to the agent's node), stale_attempt (of a run the job has moved on "
            "from), other_agent (of a run launched to another agent process), invalid "
            "(a malformed iteration record or profile).",
            ("reason",),
            registry=registry,
        )

        self.reports_scrubbed = Counter(
            "jigsaw_agent_messages_scrubbed_total",
            "Agent messages that carried NUL in text or non-finite metrics, stored scrubbed.",
            registry=registry,
        )

        self.preempted = Counter(
            "jigsaw_preempted_jobs_total",
            "Running jobs suspended by the scheduler (checkpointed, placed again later), by "
            "queue and reason: reclaim (the quota layer took lent GPUs back for a queue "
            "within its guarantee or fair share), policy (the policy's own preemption).",
            ("queue", "reason"),
            registry=registry,
        )
        self.admission_wait = Histogram(
            "jigsaw_admission_wait_time_seconds",
            "From a job's submission to its first placement, by queue.",
            ("queue",),
            buckets=WAIT_BUCKETS,
            registry=registry,
        )

    def observe_quotas(
        self,
        snapshot: ClusterSnapshot,
        plan: Plan,
        decision: QuotaDecision | None,
        quotas: Quotas,
    ) -> None:
        """Count the round's preemptions and first admissions by queue."""
        jobs = {job.id: job for job in snapshot.jobs}
        reclaimed = set(decision.victims) if decision is not None else set()
        for job_id in plan.suspend:
            if job_id in jobs:
                reason = "reclaim" if job_id in reclaimed else "policy"
                self.preempted.labels(quotas.leaf(queue_of(jobs[job_id])), reason).inc()
        for placement in plan.start:
            job = jobs.get(placement.job_id)
            if job is not None and job.held_since is None and not job.attained_gpu_seconds:
                wait = (snapshot.now - job.created_at).total_seconds()
                self.admission_wait.labels(quotas.leaf(queue_of(job))).observe(max(wait, 0.0))

    def observe_round(self, result: RoundResult, error: str | None) -> None:
        self.round_seconds.observe(result.seconds)
        self.rounds.labels("error" if error else "ok").inc()
        for decision in result.decisions:
            self.decisions.labels(decision.kind).inc()
