"""Queues end to end on SQLite and PostgreSQL: the loop reclaiming lent GPUs through the
state machine (checkpointed suspension, resumed where it stopped), /v1/queues over real
HTTP (admin-only writes, 422 and 409), and why a waiting job waits, with its place."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.jobspec import JobSpec
from scheduler.core.states import JobState, SuspendedBy
from scheduler.db import session_factory, transaction
from scheduler.dispatch import SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.models import queues
from scheduler.models.jobs import submit
from scheduler.models.users import Principal, get_or_create_user
from scheduler.orm import GPU, Agent, Allocation, IterationMetric, Job, Node
from scheduler.settings import SchedulerSettings
from scheduler.telemetry import SchedulerTelemetry
from tests.conftest import LiveApi

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SETTINGS = SchedulerSettings(
    policy="fifo", round_seconds=0.01, lease_iterations=50, agent_timeout_seconds=600
)
SPEC: dict[str, Any] = {"name": "digits", "workload": "digits-mlp", "max_iterations": 50}


def add_node(factory: sessionmaker[Session], name: str, gpus: int) -> None:
    with transaction(factory) as session:
        node = Node(name=name, address=f"{name}:7000")
        session.add(node)
        session.flush()
        session.add_all(
            GPU(node_id=node.id, index=i, kind="H100", memory_bytes=80 << 30) for i in range(gpus)
        )
        session.add(Agent(node_id=node.id, version="test", last_heartbeat_at=T0))


def add_job(factory: sessionmaker[Session], queue: str, iterations: int) -> int:
    spec = JobSpec(
        name=queue, workload="digits-mlp", workers=1, max_iterations=iterations, queue=queue
    )
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        return submit(session, spec, Principal("user", user.id, user.name, False)).id


def jobs(factory: sessionmaker[Session], ids: list[int]) -> list[Job]:
    with factory() as session:
        return [session.get_one(Job, job_id) for job_id in ids]


def held(factory: sessionmaker[Session], queue: str) -> int:
    with factory() as session:
        return len(
            session.scalars(
                select(Allocation.id)
                .join(Job, Job.id == Allocation.job_id)
                .where(Job.queue == queue, Allocation.released_at.is_(None))
            ).all()
        )


def test_a_queue_gets_its_guarantee_back_within_one_lease(live_api: LiveApi) -> None:
    factory = session_factory(live_api.engine)
    add_node(factory, "n1", 4)
    with transaction(factory) as session:
        for name in ("team-a", "team-b"):
            queues.create_queue(session, name, {"quota": 2, "borrowing_limit": 2})
    registry = CollectorRegistry()
    loop = SchedulerService(
        factory,
        SimulatedDispatcher(iterations_per_second=1),
        SETTINGS,
        telemetry=SchedulerTelemetry(registry),
    )

    a = [add_job(factory, "team-a", 200) for _ in range(4)]
    loop.run_round(T0)
    assert held(factory, "team-a") == 4  # team-b is idle: team-a borrows its two GPUs
    scrape = live_api.get("/metrics").text
    assert 'jigsaw_queue_borrowed_gpus{queue="team-a"} 2.0' in scrape.splitlines()

    b = [add_job(factory, "team-b", 30) for _ in range(2)]
    result = loop.run_round(T0 + timedelta(seconds=10))  # one round: one lease boundary
    assert (held(factory, "team-a"), held(factory, "team-b")) == (2, 2)
    assert [job.state for job in jobs(factory, b)] == [JobState.RUNNING] * 2
    victims = [job for job in jobs(factory, a) if job.state == JobState.SUSPENDED]
    assert len(victims) == 2 and result.suspended == 2
    # Suspended by the policy, checkpointing: they wait to be placed again.
    assert all(job.suspended_by == SuspendedBy.POLICY for job in victims)
    stopped_at = {job.id: job.iterations_done for job in victims}
    assert all(done == 10 for done in stopped_at.values())
    # Counted in Kueue's vocabulary: the reclaim, and the queues' use at scrape time.
    preempted = {"queue": "team-a", "reason": "reclaim"}
    assert registry.get_sample_value("jigsaw_preempted_jobs_total", preempted) == 2
    waited = registry.get_sample_value(
        "jigsaw_admission_wait_time_seconds_count", {"queue": "team-b"}
    )
    assert waited == 2
    scrape = live_api.get("/metrics").text
    for line in (
        'jigsaw_queue_gpus_in_use{queue="team-a"} 2.0',
        'jigsaw_queue_gpus_in_use{queue="team-b"} 2.0',
        'jigsaw_queue_gpu_quota{queue="team-a"} 2.0',
        'jigsaw_queue_borrowed_gpus{queue="team-a"} 0.0',
        'jigsaw_queue_pending_jobs{queue="team-a"} 2.0',
        'jigsaw_queue_admitted_jobs{queue="team-b"} 2.0',
    ):
        assert line in scrape.splitlines(), line

    now = T0 + timedelta(seconds=10)
    while any(job.state != JobState.SUCCEEDED for job in jobs(factory, a + b)):
        now += timedelta(seconds=10)
        loop.run_round(now)
        for name in ("team-a", "team-b"):
            assert held(factory, name) <= 4  # guarantee plus borrowing limit
        assert now < T0 + timedelta(hours=1)

    # Each victim resumed from where it was suspended: no iteration lost or repeated.
    with factory() as session:
        for job_id, done in stopped_at.items():
            leases = session.scalars(
                select(Allocation.lease_start_iteration)
                .where(Allocation.job_id == job_id)
                .order_by(Allocation.id)
            ).all()
            assert leases == [0, done]
    assert all(job.iterations_done == 200 for job in jobs(factory, a))


def _submit(client: httpx.Client, **patch: Any) -> httpx.Response:
    return client.post("/v1/jobs", json={**SPEC, **patch})


def test_queues_api_admin_writes_and_refusals(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice, live_api.client(live_api.root) as root:
        assert [q["name"] for q in alice.get("/v1/queues").json()["items"]] == ["default"]
        forbidden = alice.post("/v1/queues", json={"name": "team-a", "quota": 2})
        assert forbidden.status_code == 403

        created = root.post("/v1/queues", json={"name": "team-a", "quota": 2, "borrowing_limit": 1})
        assert created.status_code == 201, created.text
        assert created.json()["quota"] == 2 and created.json()["users"] == []
        assert root.post("/v1/queues", json={"name": "team-a"}).status_code == 409
        bad = root.post("/v1/queues", json={"name": "x", "quota": -1})
        assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == "quota"
        orphan = root.post("/v1/queues", json={"name": "t1", "parent": "nope"})
        assert orphan.status_code == 422
        assert orphan.json()["error"]["details"][0]["loc"] == "parent"

        # Unknown queue and a queue the user may not submit to: 422 on `queue`.
        for queue in ("nope", "private"):
            if queue == "private":
                assert root.post("/v1/queues", json={"name": queue, "users": ["bob"]}).is_success
            refused = _submit(alice, queue=queue)
            assert refused.status_code == 422, refused.text
            assert [d["loc"] for d in refused.json()["error"]["details"]] == ["queue"]

        assert alice.patch("/v1/queues/team-a", json={"quota": 3}).status_code == 403
        patched = root.patch("/v1/queues/team-a", json={"quota": 3, "weight": 2.0})
        assert patched.status_code == 200 and patched.json()["quota"] == 3
        assert patched.json()["borrowing_limit"] == 1  # fields not sent stay
        assert root.patch("/v1/queues/none-such", json={"quota": 1}).status_code == 404

        job = _submit(alice, queue="team-a").json()
        assert job["queue"] == "team-a"
        shown = alice.get("/v1/queues/team-a").json()
        assert (shown["pending_jobs"], shown["admitted_jobs"]) == (1, 0)
        assert alice.delete("/v1/queues/team-a").status_code == 403
        busy = root.delete("/v1/queues/team-a")
        assert busy.status_code == 409 and "active job" in busy.json()["error"]["message"]
        assert root.delete("/v1/queues/default").status_code == 409
        assert alice.post(f"/v1/jobs/{job['id']}/cancel").is_success
        assert root.delete("/v1/queues/team-a").status_code == 204
        assert root.get("/v1/queues/team-a").status_code == 404


def test_a_waiting_job_says_why_and_where_it_stands(live_api: LiveApi) -> None:
    factory = session_factory(live_api.engine)
    add_node(factory, "n1", 2)
    loop = SchedulerService(factory, SimulatedDispatcher(iterations_per_second=1), SETTINGS)
    with live_api.client(live_api.alice) as alice, live_api.client(live_api.root) as root:
        assert root.post("/v1/queues", json={"name": "team-a", "quota": 1}).is_success
        assert root.post("/v1/queues", json={"name": "team-b", "quota": 1}).is_success
        ids = [
            _submit(alice, queue="team-a", workers=1, max_iterations=20 * (i + 1)).json()["id"]
            for i in range(3)
        ]
        other = _submit(alice, queue="team-b", workers=1, max_iterations=1000).json()["id"]
        # Before any round: waiting, in order, with no reason yet.
        first = alice.get(f"/v1/jobs/{ids[2]}").json()
        assert first["position"] == {"queue": 3, "overall": 3}

        now = T0
        loop.run_round(now)

        def job(job_id: int) -> dict[str, Any]:
            return dict(alice.get(f"/v1/jobs/{job_id}").json())

        assert job(ids[0])["state"] == "RUNNING" and job(ids[0])["position"] is None
        assert job(other)["state"] == "RUNNING"
        second, third = job(ids[1]), job(ids[2])
        assert second["position"] == {"queue": 1, "overall": 1}
        assert third["position"] == {"queue": 2, "overall": 2}
        # team-b holds its guarantee and waits for nothing: team-a may not borrow it.
        assert (
            second["pending_reason"]
            == "queue team-a is at its quota of 1 GPUs; no idle GPU to borrow"
        )
        assert third["pending_reason"] == second["pending_reason"]
        listed = {j["id"]: j for j in alice.get("/v1/jobs").json()["items"]}
        assert listed[ids[2]]["position"] == third["position"]

        # The jobs ahead finish one by one: the place moves up, then it runs.
        while job(ids[1])["state"] == "QUEUED":
            now += timedelta(seconds=5)
            loop.run_round(now)
        assert job(ids[2])["position"] == {"queue": 1, "overall": 1}
        assert (
            job(ids[2])["pending_reason"]
            == "queue team-a is at its quota of 1 GPUs; no idle GPU to borrow"
        )
        while job(ids[2])["state"] == "QUEUED":
            now += timedelta(seconds=5)
            loop.run_round(now)
        final = job(ids[2])
        assert final["pending_reason"] is None and final["position"] is None
        events = alice.get(f"/v1/jobs/{ids[2]}/events").json()["items"]
        assert [e["message"] for e in events if e["kind"] == "pending"] == [
            "queue team-a is at its quota of 1 GPUs; no idle GPU to borrow"
        ]


def test_behind_a_blocked_head_the_reason_counts_the_jobs_ahead(engine: Engine) -> None:
    factory = session_factory(engine)
    add_node(factory, "n1", 2)
    loop = SchedulerService(factory, SimulatedDispatcher(iterations_per_second=1), SETTINGS)
    spec = JobSpec(name="big", workload="digits-mlp", workers=2, max_iterations=30)
    with transaction(factory) as session:
        user = get_or_create_user(session, "alice")
        owner = Principal("user", user.id, user.name, False)
        running = submit(session, spec.model_copy(update={"workers": 1}), owner).id
    loop.run_round(T0)
    with transaction(factory) as session:
        head = submit(session, spec, owner).id
        behind = submit(session, spec.model_copy(update={"workers": 1}), owner).id
    loop.run_round(T0 + timedelta(seconds=1))
    with factory() as session:
        assert session.get_one(Job, running).state == JobState.RUNNING
        assert session.get_one(Job, head).pending_reason == (
            "needs 2 GPUs on 1 node(s); largest free gang is 1"
        )
        # FIFO does not let it pass the head of the line.
        assert session.get_one(Job, behind).pending_reason == "waiting behind 1 earlier job(s)"
        assert queues.waiting_positions(session, [head, behind]) == {
            head: (1, 1),
            behind: (2, 2),
        }


def test_fifo_stores_when_a_waiting_job_should_start(live_api: LiveApi) -> None:
    factory = session_factory(live_api.engine)
    add_node(factory, "n1", 2)
    loop = SchedulerService(factory, SimulatedDispatcher(iterations_per_second=1), SETTINGS)
    with live_api.client(live_api.alice) as alice:
        running = _submit(alice, workers=2, max_iterations=100).json()["id"]
        loop.run_round(T0)
        # Its measured speed: half a second per iteration.
        with transaction(factory) as session:
            session.add_all(
                IterationMetric(job_id=running, iteration=i, step_seconds=0.5, reported_at=T0)
                for i in range(1, 11)
            )
        waiting = _submit(alice, workers=1).json()["id"]
        loop.run_round(T0 + timedelta(seconds=10))  # 10 iterations done, 90 to go
        shown = alice.get(f"/v1/jobs/{waiting}").json()
        expected = T0 + timedelta(seconds=10 + 90 * 0.5)
        assert datetime.fromisoformat(shown["estimated_start_at"]) == expected
        while alice.get(f"/v1/jobs/{waiting}").json()["state"] == "QUEUED":
            loop.run_round(T0 + timedelta(seconds=100))
        assert alice.get(f"/v1/jobs/{waiting}").json()["estimated_start_at"] is None
