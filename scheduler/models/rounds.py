"""Recent scheduler rounds: written by the leader each round, read by the dashboard."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler.core.rounds import RoundResult
from scheduler.orm import SchedulerRound, utcnow


def record_round(
    session: Session, result: RoundResult, *, leader: str, error: str | None = None
) -> SchedulerRound:
    """Store one round; `error` is set (and the tallies partial) when the round failed."""
    row = SchedulerRound(
        started_at=result.started_at or utcnow(),
        seconds=result.seconds,
        leader=leader[:255],
        decision_count=len(result.decisions),
        counts=result.counts(),
        decisions=[decision.to_json() for decision in result.decisions],
        error=error,
    )
    session.add(row)
    session.flush()
    return row


def prune_rounds(session: Session, keep: int) -> int:
    """Delete all but the newest `keep` rounds; returns how many went."""
    newest = session.scalar(select(func.max(SchedulerRound.id)))
    if newest is None:
        return 0
    result = session.execute(
        delete(SchedulerRound)
        .where(SchedulerRound.id <= newest - keep)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def recent_rounds(
    session: Session,
    *,
    before_id: int | None = None,
    limit: int = 50,
    with_decisions: bool = False,
) -> list[SchedulerRound]:
    """Rounds newest first; keyset pagination on id (`before_id` = last id seen)."""
    query = select(SchedulerRound)
    if before_id is not None:
        query = query.where(SchedulerRound.id < before_id)
    if with_decisions:
        query = query.where((SchedulerRound.decision_count > 0) | SchedulerRound.error.is_not(None))
    return list(session.scalars(query.order_by(SchedulerRound.id.desc()).limit(limit)))
