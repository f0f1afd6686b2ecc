"""What operators and the dashboard read: recorded rounds, leases, cluster totals,
/metrics, structured logs, and the leader lock's campaign (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from api.logs import formatter
from scheduler.db import session_factory, transaction
from scheduler.dispatch import SimulatedDispatcher
from scheduler.leader import LeaderLock, campaign
from scheduler.loop import SchedulerService
from scheduler.models.rounds import prune_rounds
from scheduler.orm import SchedulerRound
from scheduler.settings import SchedulerSettings
from scheduler.telemetry import SchedulerTelemetry
from tests.cluster import wait_for
from tests.conftest import LiveApi
from tests.test_scheduler_loop import T0, add_job, add_nodes


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def test_rounds_leases_and_totals_through_the_api(
    factory: sessionmaker[Session], live_api: LiveApi
) -> None:
    add_nodes(factory, {"a": 2})
    job_id = add_job(factory, 2, max_iterations=10)  # alice's
    queued = add_job(factory, 1)
    registry = CollectorRegistry()
    telemetry = SchedulerTelemetry(registry)
    service = SchedulerService(
        factory,
        SimulatedDispatcher(iterations_per_second=1),
        SchedulerSettings(policy="fifo", lease_iterations=20, agent_timeout_seconds=1e9),
        telemetry=telemetry,
        leader_name="test:1",
    )
    first = service.run_round(T0)
    service.record(first)
    service.record(service.run_round(T0), error="RuntimeError: a failed round")

    assert [d.kind for d in first.decisions] == ["lease"]
    assert first.decisions[0].detail["nodes"] == ["a"]
    assert registry.get_sample_value("jigsaw_scheduler_decisions_total", {"kind": "lease"}) == 1
    assert registry.get_sample_value("jigsaw_scheduler_rounds_total", {"outcome": "error"}) == 1
    assert registry.get_sample_value("jigsaw_scheduler_round_seconds_count") == 2

    alice, bob, root = (live_api.client(t) for t in (live_api.alice, live_api.bob, live_api.root))
    with alice, bob, root:
        page = alice.get("/v1/scheduler/rounds", params={"limit": 1}).json()
        assert [r["error"] for r in page["items"]] == ["RuntimeError: a failed round"]
        older = alice.get("/v1/scheduler/rounds", params={"before": page["next_before"]}).json()
        [lease] = older["items"][0]["decisions"]
        assert lease["kind"] == "lease" and lease["job_id"] == job_id
        assert (lease["gpus"], lease["lease_iterations"], lease["spb"]) == (2, 20, {})
        assert older["items"][0]["leader"] == "test:1" and older["next_before"] is None
        # Bob sees that a lease was granted, not to which job or where.
        bobs = bob.get("/v1/scheduler/rounds", params={"decisions": True}).json()["items"]
        assert bobs[-1]["decisions"] == [{"kind": "lease", "job_id": None}]
        assert root.get("/v1/scheduler/rounds").json()["items"][-1]["decisions"] == [lease]
        assert alice.get("/v1/scheduler/rounds", params={"limit": 0}).status_code == 422

        leases = alice.get(f"/v1/jobs/{job_id}/allocations").json()["items"]
        assert [(a["rank"], a["node"], a["gpu_index"]) for a in leases] == [
            (1, "a", 1),
            (0, "a", 0),
        ]
        assert all(a["released_at"] is None and a["lease_iterations"] == 20 for a in leases)
        assert bob.get(f"/v1/jobs/{job_id}/allocations").status_code == 404

        totals = root.get("/v1/cluster").json()["totals"]
        assert (totals["gpus_busy"], totals["gpus_free"], totals["gpus_unavailable"]) == (2, 0, 0)
        assert totals["jobs_by_state"]["QUEUED"] == 1 and queued
        # Held for an instant of the last hour, with no utilization reported.
        assert totals["efficiency"] == 0 and 0 <= totals["allocation"] < 0.01

        scrape = live_api.get("/metrics").text
        for sample in (
            'jigsaw_gpus{state="busy"} 2.0',
            'jigsaw_nodes{state="alive"} 1.0',
            'jigsaw_jobs{state="RUNNING"} 1.0',
            "jigsaw_cluster_efficiency_ratio 0.0",
            "jigsaw_scheduler_leader 0.0",
        ):
            assert sample in scrape, sample

    with transaction(factory) as session:
        assert prune_rounds(session, keep=1) == 1
        assert session.scalars(select(SchedulerRound.error)).all() == [
            "RuntimeError: a failed round"
        ]


def test_json_and_text_logs_carry_job_and_agent_ids_as_fields() -> None:
    record = logging.LogRecord("jigsaw", logging.INFO, __file__, 1, "launched %s", ("x",), None)
    record.job_id, record.agent_id = 7, 3
    data = json.loads(formatter("json").format(record))
    assert (data["message"], data["level"], data["job_id"], data["agent_id"]) == (
        "launched x",
        "INFO",
        7,
        3,
    )
    assert data["time"].endswith("+00:00")
    assert formatter("text").format(record).endswith("launched x [job_id=7 agent_id=3]")


def _campaigner(
    lock: LeaderLock, stop: threading.Event, retry: float
) -> tuple[threading.Thread, list[str], threading.Event]:
    """A campaign whose leader term records how it ended."""
    terms: list[str] = []
    leading_now = threading.Event()

    def lead(stopping: threading.Event, leading: Callable[[], bool]) -> None:
        leading_now.set()
        while not stopping.wait(0.05):
            if not leading():
                terms.append("lost")
                leading_now.clear()
                return
        terms.append("stopped")

    thread = threading.Thread(target=campaign, args=(lock, lead, stop, retry), daemon=True)
    thread.start()
    return thread, terms, leading_now


@pytest.mark.postgres
def test_a_leader_whose_lock_session_dies_steps_down_and_a_follower_takes_over(
    postgres_url: str, tmp_path: Path
) -> None:
    from scheduler.db import make_engine

    engines = [make_engine(postgres_url) for _ in range(3)]
    first, second = LeaderLock(engines[0], tmp_path), LeaderLock(engines[1], tmp_path)
    stop = threading.Event()
    # The first retries slowly, so the lock it loses goes to the second.
    thread_a, terms_a, leading_a = _campaigner(first, stop, retry=30)
    try:
        assert leading_a.wait(10)
        thread_b, terms_b, leading_b = _campaigner(second, stop, retry=0.1)
        assert not leading_b.wait(0.5)  # a follower while the first leads

        # The server ends the leader's lock session (as when its connection dies).
        with engines[2].connect() as admin:
            killed = admin.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks "
                    "WHERE locktype = 'advisory' AND objid = :id AND granted"
                ),
                {"id": 0x4A16_5C01},
            ).scalars()
            assert list(killed) == [True]
        assert leading_b.wait(10)
        wait_for(lambda: terms_a == ["lost"], "the first to notice it lost the lock", 10)
    finally:
        stop.set()
        thread_a.join(10)
    thread_b.join(10)
    assert terms_b == ["stopped"]
    assert not first.held and not second.held
    for engine in engines:
        engine.dispose()
