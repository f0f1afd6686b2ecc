"""The README's example trial as a user runs it: `jigsaw up --local-agents 2` with
examples/ on the agents' PYTHONPATH, `jigsaw submit examples/my_trial/spirals.yaml`, and
the job trains to its target on real worker processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from api.client import JigsawClient
from tests.cluster import ended, wait_for
from tests.servers import JIGSAW, clean_env, jigsaw_up_with

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPEC = EXAMPLES / "my_trial" / "spirals.yaml"


def test_the_example_trial_trains_to_its_target_on_local_agents(
    db_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")  # the train extra (not in the control-plane subset)
    home = tmp_path / "home"
    env = {"JIGSAW_DATABASE_URL": db_url, "PYTHONPATH": str(EXAMPLES)}
    with jigsaw_up_with(home, ["--local-agents", "2"], env) as server:
        submitted = subprocess.run(
            [*JIGSAW, "submit", str(SPEC), "--json"],
            env=clean_env(home),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = json.loads(submitted.stdout)["id"]
        job: dict[str, Any] = {}
        with JigsawClient(server.url, server.token()) as client:

            def done() -> bool:
                nonlocal job
                job = client.get_job(job_id)
                return ended(job)

            wait_for(done, f"job {job_id} ended", seconds=240)

    assert job["state"] == "SUCCEEDED", job["message"]
    assert job["spec"]["workload"] == "my_trial.spirals:TwoSpirals" and job["workers"] == 2
    # It learned: the spec's target (accuracy 0.95 on held-out points) was reached.
    assert job["metrics"]["accuracy"] >= 0.95, job["metrics"]
