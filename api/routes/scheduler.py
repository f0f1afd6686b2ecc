"""/v1/scheduler/rounds: what the scheduler leader decided recently, and how fast."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import Factory, User
from api.schemas import V1_ERRORS, RoundOut, RoundPage
from scheduler.db import transaction
from scheduler.models.jobs import owners
from scheduler.models.rounds import recent_rounds
from scheduler.models.users import Principal

router = APIRouter(prefix="/v1/scheduler", tags=["scheduler"], responses=V1_ERRORS)


def _visible(decision: dict[str, Any], owner_of: dict[int, int], viewer: Principal) -> bool:
    job_id = decision.get("job_id")
    if job_id is None or viewer.is_admin:
        return True
    return owner_of.get(job_id) == viewer.user_id


@router.get("/rounds")
def rounds(
    user: User,
    factory: Factory,
    limit: Annotated[int, Query(ge=1, le=1000, description="Rounds per page.")] = 100,
    before: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="next_before of the previous page.")
    ] = None,
    decisions: Annotated[
        bool, Query(description="Only rounds that decided something or failed.")
    ] = False,
) -> RoundPage:
    """Recent scheduling rounds, newest first: latency, tallies and decisions.

    Everyone sees every round's timing and decision kinds (as everyone sees which GPUs
    are busy); the job and details of a decision only its owner and admins see."""
    with transaction(factory) as session:
        rows = recent_rounds(session, before_id=before, limit=limit + 1, with_decisions=decisions)
        job_ids = {d["job_id"] for row in rows for d in row.decisions if d.get("job_id")}
        owner_of = {} if user.is_admin else owners(session, job_ids)
    items = [
        RoundOut.of(
            row,
            [
                d if _visible(d, owner_of, user) else {"kind": d.get("kind"), "job_id": None}
                for d in row.decisions
            ],
        )
        for row in rows[:limit]
    ]
    return RoundPage(items=items, next_before=items[-1].id if len(rows) > limit else None)
