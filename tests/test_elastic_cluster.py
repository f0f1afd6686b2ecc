"""Resizes on a live cluster: `jigsaw up` with the fifo-elastic policy and a real agent.

An elastic job on both GPUs of a node shrinks to one at a boundary when a second job
arrives, in place (its rank 0 trains on in the same process from the boundary's
checkpoint, rank 1 exits and frees its GPU for the newcomer), and grows back in place
once the second job is done (rank 0 again goes on in its process, a new rank 1 starts
from the boundary's checkpoint); each resize is stored
as a `resized` event with its mechanism and measured cost, the job resumes at the very
boundary it checkpointed at, and both jobs succeed. Under JigSaw an adaptive job's
batch changes where it runs, in place, as its measured goodput says.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from api.client import JigsawClient
from tests.cluster import Cluster, cluster

pytestmark = pytest.mark.timeout(420)

# Its steps take 50 ms (100 ms shrunk to one rank: two micro-batches), whatever the
# machine's load: shrunk, it has about a minute to go, far longer than the newcomer takes
# to run and end, so it is still there to grow back (a CPU-bound job raced the newcomer
# and sometimes ended first).
ELASTIC = {
    "name": "elastic",
    "workload": "tests.runtime_helpers:SlowTrial",
    "workers": 2,
    "elastic": {"min_workers": 1, "max_workers": 2},
    "hyperparameters": {"batch_size": 64, "learning_rate": 0.05},
    "max_iterations": 600,
}
FIXED = {"name": "fixed", "workload": "digits-mlp", "max_iterations": 150}


@contextmanager
def _one_node(home: Path, policy: str, **env: str) -> Iterator[tuple[Cluster, JigsawClient]]:
    """`jigsaw up` under `policy` (leases of 20 iterations) with one agent of 2 GPUs."""
    with cluster(
        home,
        JIGSAW_SCHEDULER_POLICY=policy,
        JIGSAW_SCHEDULER_LEASE_ITERATIONS="20",
        **env,
    ) as c:
        c.start_agent("agent-a", gpus=2)
        c.wait_nodes(alive=1)
        with c.client() as client:
            yield c, client


def test_an_elastic_job_shrinks_for_a_newcomer_and_grows_back(tmp_path: Path) -> None:
    with _one_node(tmp_path, "fifo-elastic") as (c, client):
        elastic = client.submit(ELASTIC)["id"]
        c.wait_job(elastic, lambda j: j["iterations_done"] >= 30, "past iteration 30")
        fixed = client.submit(FIXED)["id"]
        c.wait_success(fixed)
        c.wait_success(elastic)

        events = client.events(elastic)["items"]
        resized = [e["data"] for e in events if e["kind"] == "resized"]
        assert [(r["from_workers"], r["to_workers"], r["mechanism"]) for r in resized][:2] == [
            (2, 1, "in-place"),
            (1, 2, "in-place"),
        ]
        assert all(r["seconds"] > 0 for r in resized)
        # Each new gang resumed at the boundary the old one checkpointed at.
        lines = [line["message"] for line in client.logs(elastic, limit=1000)["items"]]
        for r in resized:
            assert any(
                f"resumed from the checkpoint at iteration {r['iteration']}" in line
                for line in lines
            ), (r, lines)
        assert client.get_job(elastic)["iterations_done"] == 600


ADAPTIVE = {
    "name": "adaptive",
    "workload": "digits-mlp",
    "workers": 2,
    # Up to 512: two ranks' shares of the digits (1,437 samples) hold 718 each.
    "batch": {"global": 64, "min": 64, "max": 512, "adaptive": True},
    "hyperparameters": {"learning_rate": 0.05},
    "max_iterations": 3000,
}


def test_jigsaw_changes_an_adaptive_jobs_batch_in_place_as_its_goodput_says(
    tmp_path: Path,
) -> None:
    """On two workers a larger batch spends less of each sample on synchronisation: once
    the job's measured noise says the best batch makes 10% more goodput (`rebatch_gain`),
    JigSaw asks the change, and the agent applies it at a boundary in the same processes
    (a `resized` event from 2 to 2 workers, in place); the job reports the new batch and
    succeeds."""
    with _one_node(tmp_path, "jigsaw") as (c, client):
        job = client.submit(ADAPTIVE)["id"]
        c.wait_success(job)
        events = client.events(job)["items"]
        rebatched = [e["data"] for e in events if e["kind"] == "resized"]
        assert rebatched, [(e["kind"], e["data"]) for e in events]
        for data in rebatched:
            assert (data["from_workers"], data["to_workers"]) == (2, 2)
            assert data["mechanism"] == "in-place" and 64 <= data["global_batch"] <= 512
        first = rebatched[0]
        assert first["global_batch"] > 64  # goodput grows with the batch at first
        # Its reports run at every batch it was given, on both workers. (A run requeued
        # under load resumes at the batch its placement picks: no event says that one.)
        points = client.metrics(job, points=3000)["points"]
        ran = {(p["batch_size"], p["workers"]) for p in points}
        assert {(data["global_batch"], 2) for data in rebatched} <= ran, ran
        # `max_iterations` counts steps of the base batch: each step at a larger batch
        # counted its AdaScale gain (above 1), so the job ended in fewer optimizer steps.
        done = client.get_job(job)
        assert 3000 <= done["progress"] < 3000 + 512 / 64
        assert first["iteration"] < done["iterations_done"] < 3000
        gains = [
            (b["progress"] - a["progress"], b["batch_size"] / 64)
            for a, b in zip(points, points[1:], strict=False)
            if b["iteration"] == a["iteration"] + 1 and a["batch_size"] == b["batch_size"] > 64
        ]
        assert gains and all(1 < gain <= scale + 1e-9 for gain, scale in gains), gains
