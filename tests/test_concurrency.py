"""Two API processes and one scheduler against one PostgreSQL, under interleaved load.

2,000 submissions spread over both API processes; a third of the jobs are cancelled
through the *other* API process right away, a third later while the scheduler is
placing and finishing jobs on simulated nodes. Afterwards (every process stopped) no
job is lost or duplicated, every job is in exactly one queued or terminal state that
agrees with what its cancel was told, its event log is an unbroken chain ending in
that state, and no GPU is left held.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from scheduler.db import make_engine, session_factory
from scheduler.migrate import upgrade
from scheduler.orm import Allocation, Event, Job
from tests.servers import jigsaw_up

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

JOBS = 2_000
SETTLED = {"QUEUED", "SUCCEEDED", "FAILED", "CANCELLED"}


def _spec(i: int) -> dict[str, Any]:
    return {"name": f"load-{i}", "workload": "digits-mlp", "max_iterations": 1 + i % 20}


def test_two_apis_one_scheduler_no_lost_or_duplicated_job(
    postgres_url: str, tmp_path: Path
) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine)
    env = {"JIGSAW_DATABASE_URL": postgres_url, "JIGSAW_SCHEDULER_ROUND_SECONDS": "0.05"}
    home = tmp_path / "home"
    submitted: dict[int, str] = {}  # job id -> name
    cancel_answers: dict[int, int] = {}  # job id -> HTTP status of its cancel
    failures: list[str] = []
    with (
        jigsaw_up(home, "--simulated-nodes", "4", "--gpus-per-node", "8", "--sim-speed", "400",
                  **env) as leader,
        jigsaw_up(home, "--no-scheduler", **env) as api_a,
        jigsaw_up(home, "--no-scheduler", **env) as api_b,
    ):  # fmt: skip
        headers = {"Authorization": f"Bearer {leader.token()}"}
        # Idle connections are dropped well before the server's keep-alive timeout (5 s):
        # a request on one the server is closing just then is reset (seen under load).
        limits = httpx.Limits(keepalive_expiry=1.0)
        clients = [
            httpx.Client(base_url=api.url, headers=headers, timeout=60, limits=limits)
            for api in (api_a, api_b)
        ]

        def submit(i: int) -> None:
            mine, other = clients[i % 2], clients[(i + 1) % 2]
            response = mine.post("/v1/jobs", json=_spec(i))
            if response.status_code != 201:
                failures.append(f"submit {i}: {response.status_code} {response.text}")
                return
            job_id = response.json()["id"]
            submitted[job_id] = f"load-{i}"
            if i % 3 == 0:
                cancel_answers[job_id] = other.post(f"/v1/jobs/{job_id}/cancel").status_code

        def cancel_later(job_id: int) -> None:
            cancel_answers[job_id] = (
                clients[job_id % 2].post(f"/v1/jobs/{job_id}/cancel").status_code
            )

        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(submit, range(JOBS)))
            later = [job_id for job_id, name in submitted.items() if int(name[5:]) % 3 == 1]
            list(pool.map(cancel_later, later))
        for client in clients:
            client.close()
    # Every process is stopped; the leader handed its simulated runs back to the queue.

    assert failures == []
    assert sorted(submitted.values()) == sorted(f"load-{i}" for i in range(JOBS))
    assert set(cancel_answers.values()) <= {200, 409}, set(cancel_answers.values())
    with session_factory(engine)() as session:
        jobs = {job.id: job for job in session.scalars(select(Job))}
        assert set(jobs) == set(submitted)
        assert sorted(job.name for job in jobs.values()) == sorted(submitted.values())
        for job_id, job in jobs.items():
            assert job.state in SETTLED, (job_id, job.state)
            answer = cancel_answers.get(job_id)
            if answer == 200:
                assert job.state == "CANCELLED", (job_id, job.state)
            elif answer == 409:
                # Refused only because the job had already ended on its own.
                assert job.state in {"SUCCEEDED", "FAILED"}, (job_id, job.state)
            else:
                assert job.state != "CANCELLED", (job_id, job.state)
        chains: dict[int, list[Event]] = {}
        for event in session.scalars(
            select(Event).where(Event.kind == "transition").order_by(Event.id)
        ):
            chains.setdefault(event.job_id or 0, []).append(event)
        for job_id, job in jobs.items():
            chain = chains[job_id]
            assert chain[0].from_state is None and chain[0].to_state == "QUEUED"
            for before, after in zip(chain, chain[1:], strict=False):
                assert after.from_state == before.to_state, (job_id, before.id, after.id)
            assert chain[-1].to_state == job.state, job_id
        held = session.scalar(
            select(func.count()).select_from(Allocation).where(Allocation.released_at.is_(None))
        )
        assert held == 0
        outcomes = {state: sum(j.state == state for j in jobs.values()) for state in SETTLED}
    engine.dispose()
    # The load really interleaved: some jobs ran to the end, some were cancelled.
    assert outcomes["SUCCEEDED"] > 0 and outcomes["CANCELLED"] > 0, outcomes
