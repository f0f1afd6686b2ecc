"""What benchmarks/resize_mechanism.py reads from a chain's events."""

from __future__ import annotations

import pytest

from benchmarks.resize_mechanism import transitions


def test_a_restart_runs_from_the_boundary_to_the_slowest_new_ranks_first_step() -> None:
    events = [
        ("boundary", 0, 0, 10.0),
        ("saved", 0, 0, 10.5),
        ("exited", 0, 0, 12.0),
        ("imported", 1, 0, 14.0),
        ("imported", 1, 1, 15.0),
        ("built", 1, 0, 16.0),
        ("built", 1, 1, 15.5),
        ("first", 1, 0, 18.0),
        ("first", 1, 1, 19.0),
    ]
    (resize,) = transitions(events, {(0, 0): 0.0, (1, 0): 12.0, (1, 1): 12.5}, (1, 2))
    assert resize.total == pytest.approx(9.0)
    assert resize.save == pytest.approx(0.5)
    assert resize.exit == pytest.approx(1.5)
    # The slowest spawned process, each from its own spawn.
    assert resize.startup == pytest.approx(4.0)
    assert resize.imports == pytest.approx(2.5)


def test_an_in_place_shrink_spawns_nothing_and_saves_nothing() -> None:
    events = [
        ("boundary", 0, 0, 10.0),
        ("first", 1, 0, 10.75),
        ("first", 1, 1, 10.5),
        # Rank 2 of the old group left: its events do not count.
        ("done", 0, 2, 10.1),
    ]
    spawned = {(0, rank): 0.0 for rank in range(3)}
    (resize,) = transitions(events, spawned, (3, 2))
    assert resize.total == pytest.approx(0.75)
    assert (resize.save, resize.exit, resize.startup, resize.imports) == (0.0, 0.0, 0.0, 0.0)
