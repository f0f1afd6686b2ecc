"""Code that travels with the job, end to end: `jigsaw up`, two `jigsaw agent` processes
on loopback gRPC, a trial package that exists only in the directory the user uploads
with `jigsaw submit --code DIR`, and real worker processes."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import update

from jigsaw import codearchive
from scheduler.db import make_engine
from scheduler.orm import CodeArchive
from tests.cluster import ON_POSTGRES, cluster, ended
from tests.servers import JIGSAW, clean_env

pytestmark = pytest.mark.timeout(420)

DATA_MODULE = """
import torch


def line(count: int, slope: float, generator: torch.Generator):
    inputs = torch.rand(count, 1, generator=generator)
    return inputs, slope * inputs
"""

TRIAL_MODULE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tinytrial.data import line
from worker_agent.runtime.trial import Trial


class Tiny(Trial):
    """Fits y = slope * x; `slope` is the spec's hyperparameters.trial."""

    def __init__(self, context):
        super().__init__(context)
        self.slope = context.hyperparameters.trial["slope"]
        self.inputs, self.targets = line(256, self.slope, torch.Generator().manual_seed(0))

    def build_model(self):
        return nn.Linear(1, 1)

    def train_data(self):
        return TensorDataset(self.inputs, self.targets)

    def loss(self, model, batch):
        inputs, targets = batch
        return nn.functional.mse_loss(model(inputs), targets)

    @torch.no_grad()
    def evaluate(self, model):
        inputs = self.inputs.to(self.context.device)
        error = nn.functional.mse_loss(model(inputs), self.targets.to(self.context.device))
        return {"loss": error.item(), "slope": float(self.slope)}
'''


def _package(root: Path, trial: str = TRIAL_MODULE) -> Path:
    (root / "tinytrial").mkdir(parents=True)
    (root / "tinytrial" / "__init__.py").write_text("")
    (root / "tinytrial" / "data.py").write_text(DATA_MODULE)
    (root / "tinytrial" / "trial.py").write_text(trial)
    (root / "outputs").mkdir()
    (root / "outputs" / "huge.bin").write_bytes(b"\0" * 1024)
    (root / codearchive.IGNORE_FILE).write_text("outputs/\n")
    return root


SPEC: dict[str, Any] = {
    "name": "tiny",
    "workload": "tinytrial.trial:Tiny",
    "workers": 2,
    "hyperparameters": {"batch_size": 32, "learning_rate": 0.1, "trial": {"slope": 3}},
    "max_iterations": 30,
    "eval_every": 10,
}


def _submit(home: Path, spec: dict[str, Any], *args: str) -> int:
    spec_file = home.parent / f"{spec['name']}.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    submitted = subprocess.run(
        [*JIGSAW, "submit", str(spec_file), *args, "--json"],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return int(json.loads(submitted.stdout)["id"])


@ON_POSTGRES
def test_uploaded_code_runs_on_two_agents_and_a_tampered_archive_is_refused(
    db_url: str, tmp_path: Path
) -> None:
    code = _package(tmp_path / "code")
    home = tmp_path / "home"
    with cluster(home, JIGSAW_DATABASE_URL=db_url) as c:
        c.start_agent("agent-a", gpus=1)
        c.start_agent("agent-b", gpus=1)
        c.wait_nodes(alive=2)
        uploaded = _submit(home, SPEC, "--code", str(code))
        # The same trial without its code: no agent has the module.
        missing = _submit(home, {**SPEC, "name": "no-code", "workers": 1})
        # Other code, whose stored archive is then swapped for different bytes.
        tampered_code = _package(tmp_path / "other", TRIAL_MODULE + "\n# changed\n")
        with c.client() as client:
            digest = client.upload_code(codearchive.pack(tampered_code, codearchive.Limits()))[
                "digest"
            ]
        engine = make_engine(db_url)
        try:
            with engine.begin() as connection:
                connection.execute(
                    update(CodeArchive)
                    .where(CodeArchive.digest == digest)
                    .values(data=codearchive.pack(code, codearchive.Limits()))
                )
        finally:
            engine.dispose()
        with c.client() as client:
            tampered = client.submit({**SPEC, "name": "tampered", "workers": 1, "code": digest})[
                "id"
            ]
        jobs = {job_id: c.wait_job(job_id, ended, "ended") for job_id in (uploaded, missing)}
        jobs[tampered] = c.wait_job(tampered, ended, "ended")
        with c.client() as client:
            decisions = [e for e in client.events(uploaded)["items"] if e["kind"] == "decision"]

    job = jobs[uploaded]
    assert job["state"] == "SUCCEEDED", job["message"]
    # A rank on each agent, both importing the module from the uploaded code.
    assert sorted(decisions[-1]["data"]["nodes"]) == ["agent-a", "agent-b"]
    # The trial's own hyperparameter reached it; the model learned the line.
    assert job["metrics"]["slope"] == 3.0 and job["metrics"]["loss"] < 1.0, job["metrics"]
    for agent in ("agent-a", "agent-b"):
        unpacked = home / agent / f"job-{uploaded}" / "code"
        assert (unpacked / "tinytrial" / "data.py").read_text() == DATA_MODULE
        assert not (unpacked / "outputs").exists()  # named in .jigsawignore
        assert stat.S_IMODE((unpacked / "tinytrial" / "trial.py").stat().st_mode) == 0o600
        cached = list((home / agent / "code-cache").iterdir())
        assert [path.name for path in cached] == [
            job["spec"]["code"].removeprefix("sha256:") + ".tar.gz"
        ]

    failed = jobs[missing]
    assert failed["state"] == "FAILED"
    assert "No module named 'tinytrial'" in failed["message"]
    assert "upload your code with `jigsaw submit --code DIR`" in failed["message"]
    assert "Traceback" not in failed["message"] and len(failed["message"]) < 300, failed

    refused = jobs[tampered]
    assert refused["state"] == "FAILED"
    assert f"code archive {digest} failed its checksum" in refused["message"], refused
    assert "Traceback" not in refused["message"]
