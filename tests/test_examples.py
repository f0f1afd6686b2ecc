"""The README's example trial as a user runs it: `jigsaw up --local-agents 2` (agents
that have never seen the trial), `jigsaw submit examples/spirals/spirals.yaml --code
examples/spirals`, and the job trains to its target on real worker processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from api.client import JigsawClient
from tests.cluster import ON_SQLITE, ended, wait_for
from tests.servers import JIGSAW, clean_env, jigsaw_up_with

PROJECT = Path(__file__).resolve().parents[1] / "examples" / "spirals"
SPEC = PROJECT / "spirals.yaml"


@ON_SQLITE
def test_the_example_trial_trains_to_its_target_on_local_agents(
    db_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")  # the train extra (not in the control-plane subset)
    home = tmp_path / "home"
    env = {"JIGSAW_DATABASE_URL": db_url}
    with jigsaw_up_with(home, ["--local-agents", "2"], env) as server:
        submitted = subprocess.run(
            [*JIGSAW, "submit", str(SPEC), "--code", str(PROJECT), "--json"],
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
    spec = job["spec"]
    assert spec["workload"] == "spirals_trial.trial:TwoSpirals" and job["workers"] == 2
    assert spec["code"].startswith("sha256:") and spec["spb"] == "auto"
    # It learned: the spec's target (accuracy 0.95 on held-out points) was reached.
    assert job["metrics"]["accuracy"] >= 0.95, job["metrics"]
