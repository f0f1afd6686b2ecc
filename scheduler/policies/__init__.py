"""Scheduling policies: pure functions from a cluster snapshot to a plan, chosen by name.

A policy with tuning parameters takes them as one frozen object, `schedule(snapshot,
params)`; `PARAMS` names its type. The live loop builds it from the policy's settings
section, the simulator from its options (`policy_params`); `get_policy` binds it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from pydantic import BaseModel

from scheduler.core.plan import Plan
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.policies import elastic_fifo, fifo, gandiva, jigsaw, pollux, srtf, tiresias

Policy = Callable[[ClusterSnapshot], Plan]

POLICIES: dict[str, Callable[..., Plan]] = {
    "fifo": fifo.schedule,
    "srtf": srtf.schedule,
    "tiresias": tiresias.schedule,
    "gandiva": gandiva.schedule,
    "jigsaw": jigsaw.schedule,
    "fifo-elastic": elastic_fifo.schedule,
    "pollux": pollux.schedule,
}
PARAMS: dict[str, type[BaseModel]] = {"jigsaw": jigsaw.JigsawParams}


def get_policy(name: str, params: BaseModel | None = None) -> Policy:
    """The named policy, run with `params` (None: its defaults)."""
    try:
        schedule = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown scheduling policy {name!r}: known policies are {', '.join(sorted(POLICIES))}"
        ) from None
    if params is None:
        return schedule
    expected = PARAMS.get(name)
    if expected is None or not isinstance(params, expected):
        takes = expected.__name__ if expected else "no parameters"
        raise ValueError(f"policy {name!r} takes {takes}, not {type(params).__name__}")
    return partial(schedule, params=params)


def policy_params(name: str, **values: object) -> BaseModel | None:
    """The named policy's parameters (None: it takes none): its defaults, with `values`
    for the fields it has, so what a simulation knows of its cluster (how co-located
    jobs share its GPUs) reaches the policies that predict it."""
    params = PARAMS.get(name)
    if params is None:
        return None
    return params(**{key: value for key, value in values.items() if key in params.model_fields})
