"""The checkpoint fence: a run of an older attempt never writes a checkpoint once a newer
attempt has claimed the job's directory, and ends on every rank (real gloo gangs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.runtime_helpers import TinyTrial, run_gang, worker_configs
from worker_agent.runtime import checkpoint
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE, FENCE_FILE, Fenced
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.protocol import Decision, Outcome

_FIELDS: dict[str, Any] = {
    "workload": "tests.test_runtime_fence:ClaimedMidStepTrial",
    "hyperparameters": {"batch_size": 32, "learning_rate": 0.01},
    "max_iterations": 40,
    "eval_every": 1000,
    "checkpoint_every": 4,
}


class ClaimedMidStepTrial(TinyTrial):
    """A newer attempt (2) claims the checkpoint directory (passed as the data dir)
    during rank 0's 8th step: after the check of that boundary, before its checkpoint."""

    steps = 0

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        type(self).steps += 1
        if self.context.rank == 0 and self.steps == 8 and self.context.data_dir is not None:
            checkpoint.claim(self.context.data_dir, 2)
        return super().loss(model, batch)


@dataclass
class ClaimingController(LocalController):
    """Rank 0's controller: a newer attempt claims the directory at boundary `claim_at`."""

    directory: Path | None = None
    claim_at: int = 0

    def check(self, iteration: int) -> Decision:
        if iteration == self.claim_at and self.directory is not None:
            checkpoint.claim(self.directory, 2)
        return super().check(iteration)


def _written(directory: Path) -> int:
    return int(torch.load(directory / CHECKPOINT_FILE, weights_only=True)["iteration"])


def _outcomes(controllers: list[LocalController]) -> set[tuple[Outcome, int]]:
    return {(c.status.outcome, c.status.iteration) for c in controllers if c.status is not None}


def test_a_stale_run_stops_at_its_next_boundary_and_never_writes(tmp_path: Path) -> None:
    directory = tmp_path / "job"
    configs = worker_configs(2, attempt=1, checkpoint_dir=directory, **_FIELDS)
    controllers = run_gang(
        configs, [ClaimingController(directory=directory, claim_at=5), LocalController()]
    )
    # Both ranks agree to stop at the boundary where rank 0 saw the newer claim; the
    # checkpoint stays the last one written before it.
    assert _outcomes(controllers) == {(Outcome.STOPPED, 5)}
    assert _written(directory) == 4
    assert (directory / FENCE_FILE).read_text().strip() == "2"


def test_a_run_fenced_off_between_check_and_checkpoint_writes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "job"
    configs = worker_configs(2, attempt=1, checkpoint_dir=directory, data_dir=directory, **_FIELDS)
    controllers = run_gang(configs)
    # Rank 0 found the directory taken when it came to write at iteration 8 and told
    # its peer: neither goes on, nothing is written.
    assert _outcomes(controllers) == {(Outcome.STOPPED, 8)}
    assert _written(directory) == 4


def test_a_run_older_than_the_directory_owner_does_not_start(tmp_path: Path) -> None:
    directory = tmp_path / "job"
    run_gang(
        worker_configs(1, attempt=3, checkpoint_dir=directory, **{**_FIELDS, "max_iterations": 4})
    )
    before = (directory / CHECKPOINT_FILE).read_bytes()
    stale = run_gang(worker_configs(1, attempt=2, checkpoint_dir=directory, **_FIELDS))
    assert _outcomes(stale) == {(Outcome.STOPPED, 0)}
    assert (directory / CHECKPOINT_FILE).read_bytes() == before
    # A newer one takes over and continues from the checkpoint.
    newer = run_gang(worker_configs(1, attempt=4, checkpoint_dir=directory, **_FIELDS))
    assert _outcomes(newer) == {(Outcome.SUCCEEDED, 40)}
    assert newer[0].checks[0] == 4


def test_claims_only_move_forward(tmp_path: Path) -> None:
    checkpoint.claim(tmp_path, 2)
    checkpoint.claim(tmp_path, 2)  # the same run's other ranks
    assert not checkpoint.fenced(tmp_path, 2)
    with pytest.raises(Fenced, match="attempt 2 of this job owns"):
        checkpoint.claim(tmp_path, 1)
    checkpoint.claim(tmp_path, 5)
    assert checkpoint.fenced(tmp_path, 2)
    assert (tmp_path / FENCE_FILE).read_text().strip() == "5"
