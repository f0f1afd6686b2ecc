"""Random number generator states of one rank: seeding, capture and restore.

States are plain lists and tensors so that checkpoints load with `weights_only=True`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

# Ranks draw from different streams (dropout masks differ across ranks) that depend on
# the rank, never on the process or machine that happens to hold it.
_RANK_STRIDE = 1_000_003


def seed_rank(seed: int, rank: int) -> None:
    rank_seed = seed + _RANK_STRIDE * rank
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)


def capture() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {
            "key": numpy_state["state"]["key"].tolist(),
            "pos": numpy_state["state"]["pos"],
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        # The current device is the rank's own (the loop sets it); other devices belong
        # to other ranks or jobs.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np.array(numpy_state["key"], dtype=np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
