"""Suspend at a boundary, resume elsewhere, continue the same trajectory.

Two gloo workers with dropout (rank-dependent random streams) and Adam (optimizer
state): an uninterrupted run and a run suspended at iteration K, then resumed with the
ranks placed in other processes, must end with the same parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.runtime_helpers import run_gang, worker_configs
from worker_agent.runtime.checkpoint import CHECKPOINT_FILE
from worker_agent.runtime.control import LocalController
from worker_agent.runtime.protocol import Outcome

ITERATIONS = 14
SUSPEND_AT = 6
# 1,437 digits over 2 ranks in batches of 128 make 5 batches an epoch: the run crosses
# epochs and is suspended in the middle of one.
_FIELDS: dict[str, Any] = {
    "workload": "digits-mlp",
    "hyperparameters": {"batch_size": 256, "learning_rate": 0.01, "optimizer": "adam"},
    "max_iterations": ITERATIONS,
    "eval_every": 4,
    "seed": 7,
}


def _final_state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(directory / CHECKPOINT_FILE, weights_only=True)
    return state


def test_suspend_and_resume_on_other_ranks_continues_the_same_trajectory(tmp_path: Path) -> None:
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    run_gang(worker_configs(2, checkpoint_dir=straight, **_FIELDS))

    suspended = run_gang(
        worker_configs(2, checkpoint_dir=interrupted, **_FIELDS),
        [LocalController(suspend_at=SUSPEND_AT), LocalController()],
    )
    for controller in suspended:
        assert controller.status is not None
        assert controller.status.outcome is Outcome.SUSPENDED
        assert controller.status.iteration == SUSPEND_AT
    assert _final_state(interrupted)["iteration"] == SUSPEND_AT

    resumed = run_gang(
        worker_configs(2, checkpoint_dir=interrupted, **_FIELDS), reverse_spawn_order=True
    )
    assert resumed[0].checks[0] == SUSPEND_AT
    assert [r.iteration for r in resumed[0].records] == list(range(SUSPEND_AT + 1, ITERATIONS + 1))

    _assert_same_final_state(straight, interrupted)


def test_a_killed_run_resumes_from_its_last_periodic_checkpoint(tmp_path: Path) -> None:
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    run_gang(worker_configs(2, checkpoint_dir=straight, **_FIELDS))

    # A stop writes no checkpoint, as a dead node would not: only the periodic one counts.
    stopped = run_gang(
        worker_configs(2, checkpoint_dir=crashed, checkpoint_every=5, **_FIELDS),
        [LocalController(stop_at=8), LocalController()],
    )
    assert stopped[0].status is not None and stopped[0].status.iteration == 8
    assert _final_state(crashed)["iteration"] == 5

    resumed = run_gang(worker_configs(2, checkpoint_dir=crashed, checkpoint_every=5, **_FIELDS))
    assert resumed[0].checks[0] == 5
    _assert_same_final_state(straight, crashed)


def _assert_same_final_state(straight: Path, interrupted: Path) -> None:
    expected, actual = _final_state(straight), _final_state(interrupted)
    assert actual["iteration"] == expected["iteration"] == ITERATIONS
    assert (actual["epoch"], actual["batch"]) == (expected["epoch"], expected["batch"]) == (2, 4)
    for name, tensor in expected["model"].items():
        assert torch.allclose(actual["model"][name], tensor, rtol=1e-6, atol=1e-7), name
    expected_moments = expected["optimizer"]["state"]
    for index, moments in actual["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.allclose(value, expected_moments[index][key], rtol=1e-6, atol=1e-7)


def test_stop_and_reconfiguration_reach_every_rank_at_the_same_boundary(tmp_path: Path) -> None:
    controllers = run_gang(
        worker_configs(2, checkpoint_dir=tmp_path, **_FIELDS),
        [LocalController(stop_at=4, reconfigure_at={2: {"spb": "auto"}}), LocalController()],
    )
    for controller in controllers:
        assert controller.status is not None
        assert controller.status.outcome is Outcome.STOPPED
        assert controller.status.iteration == 4
        assert controller.status.config_version == 1
    assert controllers[1].checks == []
    # Stopping is not suspending: nothing to resume from.
    assert not (tmp_path / CHECKPOINT_FILE).exists()
