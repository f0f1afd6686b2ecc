"""`jigsaw simulate --queues`: the quota layer in the simulator, queues from a file,
jobs assigned by a trace column or a name rule, bad files refused with the field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scheduler.core.quota import with_quotas
from scheduler.policies import get_policy
from scheduler.sim.engine import ClusterShape, Simulator
from scheduler.sim.queues import QueueFileError, SimQueues
from scheduler.sim.trace import load_workload
from tests.servers import JIGSAW, clean_env

HEADER = "name,submit_seconds,workers,iterations,step_seconds,queue\n"
TEAMS = {
    "queues": [
        {"name": "team-a", "quota": 2, "borrowing_limit": 2, "jobs": "^a"},
        {"name": "team-b", "quota": 2, "borrowing_limit": 2},
    ]
}


def test_a_late_queue_gets_its_guarantee_back_in_the_simulator(tmp_path: Path) -> None:
    # team-a fills the 4 GPUs with long jobs (assigned by name); team-b's two short
    # jobs (assigned by column) arrive later and start at the next lease boundary.
    rows = [f"a{i},0,1,10000,1," for i in range(4)] + [f"b{i},90,1,100,1,team-b" for i in range(2)]
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    queues = SimQueues(TEAMS)
    jobs = queues.assign(load_workload(path).jobs)
    assert [job.queue for job in jobs] == ["team-a"] * 4 + ["team-b"] * 2
    result = Simulator(
        jobs, ClusterShape.parse("1x4"), with_quotas(get_policy("fifo"), queues.quotas)
    ).run()
    late = [record for record in result.jobs if record.trace.queue == "team-b"]
    assert all(record.first_start == 120.0 for record in late)  # the boundary after 90 s
    suspended = [record for record in result.jobs if record.suspensions]
    assert len(suspended) == 2 and all(r.trace.queue == "team-a" for r in suspended)
    # Nothing is lost: every job runs its iterations.
    assert all(record.progress == record.model.iterations_total for record in result.jobs)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"queues": []}, "queues: List should have at least 1 item"),
        ({"queues": [{"name": "a", "quota": -1}]}, "queues.0.quota"),
        ({"queues": [{"name": "a", "jobs": "("}]}, "queues.0.jobs"),
        ({"queues": [{"name": "a", "parent": "b"}]}, "queues.0.parent"),
        ({"queues": [{"name": "a"}, {"name": "a"}]}, "a name appears twice"),
        ({"queues": [{"name": "a", "colour": "red"}]}, "queues.0.colour"),
    ],
)
def test_a_bad_queues_file_names_the_field(data: object, message: str) -> None:
    with pytest.raises(QueueFileError, match=message.replace("(", r"\(")):
        SimQueues(data)


def test_cli_runs_every_policy_inside_the_queues(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "a0,0,2,100,1,\na1,0,2,100,1,\nb0,5,2,50,1,team-b\n")
    queues = tmp_path / "queues.yaml"
    queues.write_text(json.dumps(TEAMS))
    command = [*JIGSAW, "simulate", "--workload", str(path), "--cluster", "1x4"]
    result = subprocess.run(
        [*command, "--policies", "fifo,srtf", "--queues", str(queues), "--json"],
        env=clean_env(tmp_path), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(row["policy"], row["jobs"]) for row in rows] == [("fifo", 3), ("srtf", 3)]

    path.write_text(HEADER + "a0,0,2,100,1,nowhere\n")
    refused = subprocess.run(
        [*command, "--queues", str(queues)],
        env=clean_env(tmp_path), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "queue nowhere is not in the queues file" in refused.stderr
