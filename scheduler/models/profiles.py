"""Model profiles: a workload's measured per-stage costs and SPB statistical price
(`jigsaw.spb.SPBProfile` as JSON), one row per workload and key.

The key says what the costs were measured at (`profile_key`): per-worker batch size and
device kind, because step times depend on both. Saving again replaces the row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jigsaw.spb import SPBProfile
from scheduler.orm import ModelProfile, utcnow


def profile_key(profile: SPBProfile, device_kind: str) -> str:
    return f"{device_kind}/batch-{profile.per_worker_batch}"


def save_profile(
    session: Session,
    profile: SPBProfile,
    device_kind: str,
    utilization: float | None = None,
    *,
    keep_price: bool = False,
    peak_memory_bytes: int | None = None,
) -> ModelProfile:
    """`utilization`, `peak_memory_bytes`: the device's while the profile's passes ran
    (None: not measured).
    `keep_price`: a profile without SPB's statistical price (what every new SPB job
    measures) keeps the price stored under its key (`jigsaw profile --efficiency
    --save`'s, which takes training runs to measure and depends on neither the stage
    timings nor the device), instead of erasing it."""
    key = profile_key(profile, device_kind)
    row = session.scalar(
        select(ModelProfile).where(
            ModelProfile.workload == profile.workload, ModelProfile.key == key
        )
    )
    data: dict[str, Any] = {**profile.to_json(), "device_kind": device_kind}
    if keep_price and not profile.steps_ratio and row is not None:
        data["steps_ratio"] = row.data.get("steps_ratio", {})
    if utilization is not None:
        data["utilization"] = utilization
    if peak_memory_bytes is not None:
        data["peak_memory_bytes"] = peak_memory_bytes
    if row is None:
        row = ModelProfile(workload=profile.workload, key=key, data=data)
        session.add(row)
    else:
        row.data = data
        row.created_at = utcnow()
    session.flush()
    return row


def list_profiles(session: Session, workload: str | None = None) -> list[ModelProfile]:
    query = select(ModelProfile).order_by(ModelProfile.workload, ModelProfile.key)
    if workload is not None:
        query = query.where(ModelProfile.workload == workload)
    return list(session.scalars(query))
