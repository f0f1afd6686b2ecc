"""Prometheus metrics of the scheduler side: rounds, decisions, leadership, reports.

They live on the registry `/metrics` serves (`api.observability`), one per process:
every replica exports them, and only the leader's move, so a dashboard sums over pods.
Labels are bounded: a decision kind or an outcome, never a job or agent id.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.core.rounds import RoundResult

# Rounds take milliseconds on a small cluster and up to seconds on a very large one.
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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

    def observe_round(self, result: RoundResult, error: str | None) -> None:
        self.round_seconds.observe(result.seconds)
        self.rounds.labels("error" if error else "ok").inc()
        for decision in result.decisions:
            self.decisions.labels(decision.kind).inc()
