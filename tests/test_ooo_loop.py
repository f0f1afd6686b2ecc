"""`backprop: ooo` in the platform's training loop ends where standard DDP training ends,
with the spec's k and with the k the loop chooses itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runtime_helpers import run_gang, worker_configs
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE

_FIELDS: dict[str, Any] = {
    "workload": "digits-mlp",
    "hyperparameters": {"batch_size": 128, "learning_rate": 0.01, "optimizer": "adam"},
    "max_iterations": 6,
    "eval_every": 4,  # an evaluation in the middle must see every update applied
    "seed": 3,
}


def _checkpoint(directory: Path, backprop: str, first_k: int | None) -> dict[str, Any]:
    controllers = run_gang(
        worker_configs(
            2, checkpoint_dir=directory, backprop=backprop, ooo_first_k=first_k, **_FIELDS
        )
    )
    state: dict[str, Any] = torch.load(directory / CHECKPOINT_FILE, weights_only=True)
    state["evaluations"] = controllers[0].evaluations
    state["profiles"] = controllers[0].profiles
    return state


@pytest.fixture(scope="module")
def standard(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _checkpoint(tmp_path_factory.mktemp("standard"), "standard", None)


@pytest.mark.parametrize("first_k", [1, None])
def test_ooo_job_trains_to_the_same_parameters_and_evaluations_as_ddp(
    tmp_path: Path, first_k: int | None, standard: dict[str, Any]
) -> None:
    ooo = _checkpoint(tmp_path / "ooo", "ooo", first_k)
    # Without a k in the spec, rank 0 measures the model to choose one (and reports it).
    assert len(ooo["profiles"]) == (1 if first_k is None else 0)
    assert standard["profiles"] == []
    assert ooo["iteration"] == standard["iteration"] == 6
    for name, expected in standard["model"].items():
        torch.testing.assert_close(ooo["model"][name], expected, rtol=1e-5, atol=1e-6, msg=name)
    for (_, a), (_, b) in zip(
        sorted(standard["optimizer"]["state"].items()),
        sorted(ooo["optimizer"]["state"].items()),
        strict=True,
    ):
        torch.testing.assert_close(b["exp_avg"], a["exp_avg"], rtol=1e-5, atol=1e-7)
    assert len(ooo["evaluations"]) == len(standard["evaluations"]) == 2
    for (at_a, metrics_a), (at_b, metrics_b) in zip(
        standard["evaluations"], ooo["evaluations"], strict=True
    ):
        assert at_a == at_b
        assert abs(metrics_b["loss"] - metrics_a["loss"]) < 1e-5
