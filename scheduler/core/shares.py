"""GPU counts that minimise a sum of per-job scores within a capacity: the
multiple-choice knapsack both Pollux's objective (`scheduler.policies.speedup`) and
JigSaw's fluid sizing (`scheduler.policies.jigsaw.fluid`) are, solved exactly.

A dynamic program over GPUs used, one job at a time, each row a numpy vector: O(J x S)
vector steps of G + 1 entries for J jobs, S sizes a job may take and G GPUs.
"""

from __future__ import annotations

import numpy as np


def allocate(scores: list[dict[int, float]], capacity: int) -> list[int]:
    """The GPU count of each job (a key of its scores) that minimises the sum of the
    chosen scores with at most `capacity` GPUs in all; on a tie, the fewest GPUs in all."""
    best = np.full(capacity + 1, np.inf)  # least sum with exactly g GPUs used
    best[0] = 0.0
    choices: list[np.ndarray] = []
    for options in scores:
        nxt = np.full(capacity + 1, np.inf)
        chose = np.zeros(capacity + 1, dtype=np.int64)
        for workers, score in sorted(options.items(), reverse=True):
            if workers > capacity:
                continue
            reached = best[: capacity + 1 - workers] + score
            better = reached < nxt[workers:]
            nxt[workers:][better] = reached[better]
            chose[workers:][better] = workers
        best = nxt
        choices.append(chose)
    used = int(np.argmin(best))  # the first minimum: the fewest GPUs
    counts = []
    for chose in reversed(choices):
        counts.append(int(chose[used]))
        used -= counts[-1]
    return counts[::-1]
