"""An admin drains, undrains and removes nodes, on both databases: over live HTTP, with
the real scheduler loop placing jobs through the simulated dispatcher."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.gpus import GpuSlot
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.core.states import JobState
from scheduler.db import session_factory, transaction
from scheduler.dispatch import Command, SimulatedDispatcher
from scheduler.kube import NodeStatus, apply_inventory
from scheduler.loop import SchedulerService
from scheduler.models.agents import register
from scheduler.models.nodes import DRAINED_MESSAGE
from scheduler.models.snapshot import build_snapshot
from scheduler.models.states import transition
from scheduler.orm import GPU, Agent, Allocation, Event, Job, Node, utcnow
from scheduler.policies import fifo
from scheduler.settings import SchedulerSettings
from tests.conftest import LiveApi

SETTINGS = SchedulerSettings(
    policy="fifo", round_seconds=0.01, lease_iterations=50, agent_timeout_seconds=30
)
SPEC = {"name": "j", "workload": "digits-mlp", "workers": 2, "max_iterations": 1_000_000}


@dataclass
class Cluster:
    api: LiveApi
    factory: sessionmaker[Session]
    loop: SchedulerService
    dispatcher: SimulatedDispatcher
    alice: httpx.Client
    root: httpx.Client

    def add_nodes(self, *names: str, gpus: int = 2) -> None:
        slots = [GpuSlot(i, "virtual-cpu", 1 << 30, virtual=True) for i in range(gpus)]
        with transaction(self.factory) as session:
            for name in names:
                register(session, node_name=name, address="127.0.0.1", gpus=slots, version="t")

    def submit(self, **fields: Any) -> int:
        response = self.alice.post("/v1/jobs", json={**SPEC, **fields})
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def nodes_of(self, job_id: int) -> set[str]:
        with self.factory() as session:
            return set(
                session.scalars(
                    select(Node.name)
                    .join(GPU, GPU.node_id == Node.id)
                    .join(Allocation, Allocation.gpu_id == GPU.id)
                    .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
                )
            )

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.alice.get(f"/v1/jobs/{job_id}").json())

    def cluster_nodes(self) -> dict[str, dict[str, Any]]:
        return {node["name"]: node for node in self.alice.get("/v1/cluster").json()["nodes"]}


@pytest.fixture
def cluster(live_api: LiveApi) -> Iterator[Cluster]:
    factory = session_factory(live_api.engine)
    dispatcher = SimulatedDispatcher(iterations_per_second=1)
    loop = SchedulerService(factory, dispatcher, SETTINGS)
    with live_api.client(live_api.alice) as alice, live_api.client(live_api.root) as root:
        yield Cluster(live_api, factory, loop, dispatcher, alice, root)


def test_a_drained_node_takes_no_new_jobs_until_undrained(cluster: Cluster) -> None:
    c = cluster
    c.add_nodes("n0", "n1")
    assert c.alice.post("/v1/nodes/n0/drain").status_code == 403
    drained = c.root.post("/v1/nodes/n0/drain")
    assert drained.status_code == 200, drained.text
    assert drained.json()["drained_at"] is not None
    view = c.alice.get("/v1/cluster").json()
    node = {n["name"]: n for n in view["nodes"]}["n0"]
    assert node["drained_at"] is not None and node["schedulable"]  # Kubernetes' flag apart
    assert (view["totals"]["gpus_free"], view["totals"]["gpus_unavailable"]) == (2, 2)

    first, second = c.submit(), c.submit()
    c.loop.run_round()
    c.loop.run_round()
    assert c.nodes_of(first) == {"n1"} and c.job(first)["state"] == "RUNNING"
    assert c.nodes_of(second) == set() and c.job(second)["state"] == "QUEUED"

    assert c.alice.post("/v1/nodes/n0/undrain").status_code == 403
    undrained = c.root.post("/v1/nodes/n0/undrain")
    assert undrained.status_code == 200 and undrained.json()["drained_at"] is None
    c.loop.run_round()
    assert c.nodes_of(second) == {"n0"} and c.job(second)["state"] == "RUNNING"
    assert c.cluster_nodes()["n0"]["drained_at"] is None


def test_a_drain_between_the_snapshot_and_the_placement_still_keeps_jobs_off(
    cluster: Cluster,
) -> None:
    """The API drains while the loop is planning: the plan (made on the older snapshot)
    is not applied to the drained node."""
    c = cluster
    c.add_nodes("n0")
    job = c.submit()

    def plan_then_drain(snapshot: ClusterSnapshot) -> Any:
        plan = fifo.schedule(snapshot)
        assert c.root.post("/v1/nodes/n0/drain").status_code == 200
        return plan

    c.loop._policy = plan_then_drain  # stands for a concurrent API call
    result = c.loop.run_round()
    assert result.started == 0 and result.conflicts == 1
    assert c.nodes_of(job) == set() and c.job(job)["state"] == "QUEUED"


def test_drain_now_moves_running_jobs_to_other_nodes(cluster: Cluster) -> None:
    c = cluster
    c.add_nodes("n0", "n1")
    assert c.root.post("/v1/nodes/n1/drain").status_code == 200
    job = c.submit()
    c.loop.run_round()
    assert c.nodes_of(job) == {"n0"} and c.job(job)["state"] == "RUNNING"
    assert c.root.post("/v1/nodes/n1/undrain").status_code == 200

    moved = c.root.post("/v1/nodes/n0/drain", params={"now": True})
    assert moved.status_code == 200, moved.text
    assert moved.json()["jobs_suspended"] == [job] and moved.json()["jobs_requeued"] == []
    assert c.job(job)["state"] == "SUSPENDED" and c.job(job)["message"] == DRAINED_MESSAGE

    c.loop.run_round()
    # Its processes were told to checkpoint and exit; then it was queued and placed anew.
    assert Command("suspend", job) in c.dispatcher.commands
    assert c.nodes_of(job) == {"n1"} and c.job(job)["state"] == "RUNNING"
    with c.factory() as session:
        moves = session.execute(
            select(Event.from_state, Event.to_state, Event.actor)
            .where(Event.job_id == job, Event.kind == "transition")
            .order_by(Event.id)
        ).all()
    assert [tuple(move) for move in moves[-4:]] == [
        ("RUNNING", "SUSPENDED", "root"),
        ("SUSPENDED", "QUEUED", "scheduler"),
        ("QUEUED", "SCHEDULED", "scheduler"),
        ("SCHEDULED", "RUNNING", "scheduler"),
    ]


def test_only_a_drained_idle_node_without_a_live_agent_is_removed(cluster: Cluster) -> None:
    c = cluster
    c.add_nodes("n0", "n1")
    c.root.post("/v1/nodes/n1/drain")
    job = c.submit()
    c.loop.run_round()
    assert c.nodes_of(job) == {"n0"}
    c.root.post("/v1/nodes/n1/undrain")

    def refusal() -> str:
        response = c.root.delete("/v1/nodes/n0")
        assert response.status_code == 409, response.text
        return str(response.json()["error"]["message"])

    assert "not drained" in refusal()
    assert c.root.post("/v1/nodes/n0/drain").status_code == 200
    assert f"jobs [{job}]" in refusal()
    assert c.alice.post(f"/v1/jobs/{job}/cancel").status_code == 200
    c.loop.run_round()
    assert "agent" in refusal() and "alive" in refusal()
    assert c.alice.delete("/v1/nodes/n0").status_code == 403

    # The agent falls silent; the loop declares it lost in a round over the agent
    # timeout after its first (a new leader times agents from its own start), where
    # n1's agent has heartbeated.
    later = utcnow() + timedelta(minutes=1)
    with transaction(c.factory) as session:
        for name, heard in (("n0", utcnow() - timedelta(minutes=5)), ("n1", later)):
            node_id = session.scalar(select(Node.id).where(Node.name == name))
            session.execute(
                update(Agent).where(Agent.node_id == node_id).values(last_heartbeat_at=heard)
            )
    assert c.loop.run_round(later).agents_lost == 1
    removed = c.root.delete("/v1/nodes/n0")
    assert removed.status_code == 200, removed.text
    assert removed.json()["removed_at"] is not None
    view = c.alice.get("/v1/cluster").json()
    assert [node["name"] for node in view["nodes"]] == ["n1"]
    assert view["totals"]["gpus"] == 2
    with c.factory() as session:
        snapshot = build_snapshot(session, utcnow())
        # Its GPUs' allocation history stays.
        assert session.scalar(select(Allocation.job_id).where(Allocation.job_id == job)) == job
    assert [node.name for node in snapshot.nodes] == ["n1"]
    for method, path in (
        ("DELETE", "/v1/nodes/n0"),
        ("POST", "/v1/nodes/n0/drain"),
        ("POST", "/v1/nodes/n0/undrain"),
        ("POST", "/v1/nodes/nowhere/drain"),
    ):
        assert c.root.request(method, path).status_code == 404, path
    for bad in ("bad_name", "-x", "a..b!"):
        assert c.root.post(f"/v1/nodes/{bad}/drain").status_code == 422, bad

    # An agent serving the name again brings it back, as a fresh node.
    c.add_nodes("n0")
    assert c.cluster_nodes()["n0"]["drained_at"] is None


def test_kubernetes_inventory_and_the_admins_drain_do_not_undo_each_other(
    cluster: Cluster,
) -> None:
    c = cluster
    c.add_nodes("n0")

    def sync(schedulable: bool, reason: str = "") -> None:
        with transaction(c.factory) as session:
            apply_inventory(session, [NodeStatus("n0", schedulable, reason)], "")

    def takes_jobs() -> bool:
        with c.factory() as session:
            [node] = build_snapshot(session, utcnow()).nodes
        return bool(node.free_gpus())

    c.root.post("/v1/nodes/n0/drain")
    sync(True)
    assert c.cluster_nodes()["n0"]["drained_at"] is not None and not takes_jobs()
    sync(False, "cordoned")
    c.root.post("/v1/nodes/n0/undrain")
    node = c.cluster_nodes()["n0"]
    assert node["drained_at"] is None and not node["schedulable"] and not takes_jobs()
    assert node["unschedulable_reason"] == "cordoned"
    sync(True)
    assert takes_jobs()
    with c.factory() as session:
        kinds = list(
            session.scalars(select(Event.kind).where(Event.kind.like("node_%")).order_by(Event.id))
        )
    assert kinds == ["node_drained", "node_unschedulable", "node_undrained", "node_schedulable"]


def test_drain_now_sends_a_job_being_launched_back_to_the_queue(cluster: Cluster) -> None:
    c = cluster
    c.add_nodes("n0")
    job = c.submit()
    with transaction(c.factory) as session:
        # As the loop leaves a job between its placement and its launch.
        transition(session, session.get_one(Job, job), JobState.SCHEDULED, actor="test")
        gpu_ids = session.scalars(select(GPU.id).order_by(GPU.index)).all()
        session.add_all(
            Allocation(job_id=job, gpu_id=gpu_id, rank=rank, lease_iterations=50)
            for rank, gpu_id in enumerate(gpu_ids)
        )
    moved = c.root.post("/v1/nodes/n0/drain", params={"now": True}).json()
    assert moved["jobs_requeued"] == [job] and moved["jobs_suspended"] == []
    assert c.job(job)["state"] == "QUEUED" and c.nodes_of(job) == set()
