"""GPU counts that minimise a sum of per-job scores within a capacity: the
multiple-choice knapsack both Pollux's objective (`scheduler.policies.speedup`) and
JigSaw's fluid sizing (`scheduler.policies.jigsaw.fluid`) are.

`allocate` solves it exactly: a dynamic program over GPUs used, one job at a time, each
row a numpy vector: O(J x S) vector steps of G + 1 entries for J jobs, S sizes a job may
take and G GPUs. `relax` solves it near-exactly in O(J x S) per step of a bisection,
whatever G: where J x G is too large for the program.
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


def relax(scores: list[dict[int, float]], capacity: int) -> list[int]:
    """`allocate`'s problem by its Lagrangian relaxation: each job takes the count that
    minimises its score plus a price per GPU (every job's scores include 0 GPUs), the
    least price at which the counts fit found by bisection; then the GPUs left go, one
    upgrade at a time, to the job whose larger count lowers the sum most per GPU.
    Optimal on the scores' convex hulls; what it can miss is a few jobs' worth (those
    the price leaves between two counts), a share of the sum that falls with their
    number."""
    if not scores:
        return []
    if any(0 not in options for options in scores):
        raise ValueError("every job's scores must include 0 GPUs")
    width = max(len(options) for options in scores)
    sizes = np.zeros((len(scores), width), dtype=np.int64)
    costs = np.full((len(scores), width), np.inf)
    for row, options in enumerate(scores):
        kept = sorted((w, score) for w, score in options.items() if w <= capacity)
        for col, (workers, score) in enumerate(kept):  # 0 GPUs first
            sizes[row, col], costs[row, col] = workers, score
    rows = np.arange(len(scores))

    def chosen(price: float) -> np.ndarray:
        # The first minimum: on a tie, the fewest GPUs.
        return np.argmin(costs + price * sizes, axis=1)

    finite = costs[np.isfinite(costs)]
    low, high = 0.0, float(finite.max() - finite.min()) + 1.0  # at `high` none pays a GPU
    if sizes[rows, chosen(low)].sum() > capacity:
        for _ in range(64):
            middle = (low + high) / 2
            if sizes[rows, chosen(middle)].sum() > capacity:
                low = middle
            else:
                high = middle
        pick = chosen(high)
    else:
        pick = chosen(low)
    left = capacity - int(sizes[rows, pick].sum())
    while left > 0:
        now_size, now_cost = sizes[rows, pick][:, None], costs[rows, pick][:, None]
        extra = sizes - now_size
        fits = (extra > 0) & (extra <= left) & np.isfinite(costs)
        gain = np.where(fits, (now_cost - costs) / np.maximum(extra, 1), 0.0)
        job, col = (int(i) for i in np.unravel_index(int(np.argmax(gain)), gain.shape))
        if gain[job, col] <= 0:
            break
        left -= int(extra[job, col])
        pick[job] = col
    return [int(sizes[row, col]) for row, col in enumerate(pick)]
