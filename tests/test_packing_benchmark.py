"""What benchmarks/packing.py counts from a live run's allocations."""

from __future__ import annotations

import math

from benchmarks.packing import Hold, duplicate_launches, packings


def test_a_placement_onto_a_gpu_another_job_holds_is_one_packing() -> None:
    holds = [
        Hold(job_id=1, gpu_id=10, rank=0, start=0.0, end=100.0),
        Hold(job_id=2, gpu_id=11, rank=0, start=0.0, end=50.0),
        # Job 3's two ranks join jobs 1 and 2 at once: one packing.
        Hold(job_id=3, gpu_id=10, rank=0, start=10.0, end=40.0),
        Hold(job_id=3, gpu_id=11, rank=1, start=10.0, end=40.0),
        # Then it takes GPU 11 once job 2 let it go: not a packing.
        Hold(job_id=3, gpu_id=11, rank=0, start=60.0, end=math.inf),
    ]
    assert packings(holds) == 1
    assert packings([*holds, Hold(job_id=4, gpu_id=11, rank=0, start=70.0, end=80.0)]) == 2


def test_a_rank_allocated_again_while_held_is_a_duplicate_launch() -> None:
    relaunched = [
        Hold(job_id=1, gpu_id=10, rank=0, start=0.0, end=30.0),
        Hold(job_id=1, gpu_id=11, rank=0, start=30.0, end=60.0),  # after the release
        Hold(job_id=1, gpu_id=11, rank=1, start=30.0, end=60.0),
    ]
    assert duplicate_launches(relaunched) == 0
    twice = [*relaunched, Hold(job_id=1, gpu_id=12, rank=0, start=50.0, end=math.inf)]
    assert duplicate_launches(twice) == 1
    # Another job's rank 0 at that time is no duplicate of this one's.
    assert duplicate_launches([*relaunched, Hold(2, 12, 0, 50.0, math.inf)]) == 0
