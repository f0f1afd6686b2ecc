"""Packing before a job has run, on a live cluster, on SQLite and PostgreSQL: `jigsaw up`
with JigSaw and a `jigsaw agent` whose one virtual GPU takes several jobs.

Two jobs whose workloads were profiled at their batch on the node's kind of GPU (stored
with the device's utilization and peak memory, as `jigsaw profile --save` stores them)
are submitted at once. The profiles say each leaves the GPU mostly idle, as small jobs
leave a large GPU: JigSaw places both on it in the same round, each launched capped at
what its profile predicts, not at the whole GPU, and both train every iteration once,
side by side, neither suspended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.db import make_engine
from scheduler.models.agents import allowance
from scheduler.models.measured import PROFILED_MEMORY_FACTOR
from scheduler.orm import GPU, Allocation, IterationMetric
from tests.cluster import ON_SQLITE, cluster, ended

pytestmark = pytest.mark.timeout(300)

ITERATIONS = 60
PEAK = 1 << 30  # a CPU process's resident peak, with room


def _profile(batch: int) -> dict[str, Any]:
    stage = {
        "forward_seconds": 0.001,
        "backward_input_seconds": 0.001,
        "backward_weight_seconds": 0.001,
        "activation_bytes": 1 << 20,
        "parameter_bytes": 1 << 20,
    }
    return {
        "per_worker_batch": batch,
        "stages": [stage, stage],
        "device_kind": "virtual-cpu",
        "utilization": 0.05,
        "peak_memory_bytes": PEAK,
    }


@ON_SQLITE
def test_two_profiled_jobs_share_a_gpu_from_their_first_round(tmp_path: Path, db_url: str) -> None:
    settings = {"JIGSAW_DATABASE_URL": db_url, "JIGSAW_SCHEDULER_POLICY": "jigsaw"}
    with cluster(tmp_path / "home", **settings) as c:
        c.start_agent("gpus", gpus=1, JIGSAW_AGENT_MAX_JOBS_PER_GPU="3")
        c.wait_nodes(alive=1)
        with c.client() as client:
            batches = (16, 64)
            for batch in batches:
                client.put_profile("digits-mlp", _profile(batch))
            ids = [
                client.submit(
                    {
                        "name": f"mlp-b{batch}",
                        "workload": "digits-mlp",
                        "hyperparameters": {"batch_size": batch, "learning_rate": 0.05},
                        "max_iterations": ITERATIONS,
                    }
                )["id"]
                for batch in batches
            ]
            finished = [c.wait_job(job_id, ended, "ended") for job_id in ids]
            events = [client.events(job_id)["items"] for job_id in ids]

    assert all(job["state"] == "SUCCEEDED" for job in finished), finished
    assert not any(e["to_state"] == "SUSPENDED" for items in events for e in items), events
    engine = make_engine(db_url)
    try:
        with engine.connect() as connection:
            # The agent's limit, as registered: what packing may place on the slot.
            assert connection.execute(select(GPU.max_jobs)).scalars().all() == [3]
            holds = connection.execute(
                select(Allocation.job_id, Allocation.gpu_id, Allocation.memory_bytes)
            ).all()
            # One placement each, on the one GPU, capped by the profile's prediction, or
            # lower once the run had shown it needs at most half of it.
            assert sorted(job_id for job_id, _, _ in holds) == sorted(ids), holds
            assert len({gpu for _, gpu, _ in holds}) == 1, holds
            cap = allowance(PEAK, PROFILED_MEMORY_FACTOR)
            assert all(m == cap or 0 < 2 * m <= cap for _, _, m in holds), (cap, holds)
            for job_id in ids:
                rows = connection.execute(
                    select(IterationMetric.iteration, IterationMetric.co_runners).where(
                        IterationMetric.job_id == job_id
                    )
                ).all()
                # Every iteration once; some of them beside the other job.
                assert sorted(i for i, _ in rows) == list(range(1, ITERATIONS + 1)), job_id
                assert any(co for _, co in rows if co), job_id
    finally:
        engine.dispose()
