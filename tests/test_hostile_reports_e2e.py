"""What trial code reports cannot disturb other jobs, and what an agent holds is not
lost with it: real `jigsaw up`, real agents, real training processes.

The probes: a trial that prints NUL (and fails with NUL in its error) and a trial whose
evaluation returns inf and NaN, beside a bystander job on another agent; an agent
SIGKILLed with iteration reports queued (its scheduler unreachable), then restarted.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from scheduler.orm import IterationMetric
from tests.cluster import ON_POSTGRES, cluster, ended, kill, wait_for, worker_pids
from worker_agent.spool import SPOOL_FILE, ReportSpool

pytestmark = pytest.mark.timeout(420)

_TRIALS = "tests.runtime_helpers"


def _running(job: dict[str, Any]) -> bool:
    return job["state"] == "RUNNING" and job["iterations_done"] > 0


# PostgreSQL only: it is the backend that refuses a NUL in text (both backends take the
# sanitised reports in test_report_writer and test_api_hardening).
@ON_POSTGRES
def test_nul_and_inf_from_trials_disturb_no_other_job_and_end_once(
    db_url: str, tmp_path: Path
) -> None:
    env = {"JIGSAW_DATABASE_URL": db_url, "JIGSAW_SCHEDULER_POLICY": "fifo"}
    with cluster(tmp_path, **env) as c:
        c.start_agent("agent-b", gpus=1)
        c.wait_nodes(alive=1)
        with c.client() as client:
            # On agent-b, the only node yet; it runs until well after the others end.
            bystander = client.submit(
                {"name": "bystander", "workload": f"{_TRIALS}:SlowTrial", "max_iterations": 600}
            )["id"]
            c.wait_job(bystander, _running, "training")
            c.start_agent("agent-a", gpus=2)
            c.wait_nodes(alive=2)
            nul = client.submit(
                {"name": "nul", "workload": f"{_TRIALS}:NulPrintingTrial", "max_iterations": 300}
            )["id"]
            inf = client.submit(
                {"name": "inf", "workload": f"{_TRIALS}:InfEvaluatingTrial", "max_iterations": 150}
            )["id"]
            jobs = {job_id: c.wait_job(job_id, ended, "ended") for job_id in (nul, inf, bystander)}

            # Each bad job reached its end once: recorded, not relaunched.
            assert (jobs[nul]["state"], jobs[nul]["attempts"]) == ("FAILED", 1), jobs[nul]
            assert "a NUL \ufffd in the error" in jobs[nul]["message"]
            assert (jobs[inf]["state"], jobs[inf]["attempts"]) == ("SUCCEEDED", 1), jobs[inf]
            assert jobs[inf]["metrics"] == {"steps": 1.0}  # inf and NaN are not stored
            lines = [line["message"] for line in client.logs(nul, limit=1000)["items"]]
            assert any("\ufffd in a log line" in line for line in lines), lines[-5:]

            # The bystander lost nothing: one run, every iteration reported.
            assert (jobs[bystander]["state"], jobs[bystander]["attempts"]) == ("SUCCEEDED", 1)
            points = client.metrics(bystander, points=5000)["points"]
            assert [p["iteration"] for p in points] == list(range(1, 601))
            assert all(node["alive"] for node in client.cluster()["nodes"])
        assert c.server is not None
        assert "agents lost" not in c.server.log.read_text()


def test_reports_queued_in_a_killed_agent_arrive_once_after_its_restart(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as c:
        c.start_agent("agent-a", gpus=1)
        c.wait_nodes(alive=1)
        with c.client() as client:
            job_id = client.submit(
                {"name": "long", "workload": f"{_TRIALS}:SlowTrial", "max_iterations": 100_000}
            )["id"]
            c.wait_job(job_id, _running, "training")

        # The scheduler goes away; training goes on and the agent queues its reports.
        assert c.server is not None
        c.server.proc.send_signal(signal.SIGTERM)
        c.server.proc.wait(timeout=60)
        spool = tmp_path / "agent-a" / SPOOL_FILE
        wait_for(lambda: spool.exists() and spool.stat().st_size > 2000, "queued reports")
        victims = worker_pids(tmp_path)
        kill(c.agents["agent-a"])
        wait_for(lambda: not set(victims) & set(worker_pids(tmp_path)), "its workers to die")
        queued = sorted(record.iteration for _, record in ReportSpool(spool).recover())
        assert queued

        c.start_server()
        with c.client() as client:
            client.cancel(job_id)  # its processes are gone; nothing is to run it again
        c.start_agent("agent-a", gpus=1)

        engine = create_engine(f"sqlite:///{tmp_path / 'jigsaw.db'}")
        try:

            def stored() -> list[int]:
                with engine.connect() as connection:
                    return sorted(
                        connection.scalars(
                            select(IterationMetric.iteration).where(
                                IterationMetric.job_id == job_id
                            )
                        )
                    )

            wait_for(lambda: set(queued) <= set(stored()), "the queued reports")
            iterations = stored()
            assert len(iterations) == len(set(iterations)), "an iteration arrived twice"
            assert iterations[-1] == queued[-1]
        finally:
            engine.dispose()
        wait_for(lambda: spool.stat().st_size == 0, "the spool to empty")
