"""Jobs' code archives: stored by digest on upload, owned by who uploaded them, read by
agents, expired by retention."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, exists, or_, select
from sqlalchemy.orm import Session

from jigsaw import codearchive
from scheduler.models.agents import ran_on
from scheduler.models.users import Principal
from scheduler.orm import CodeArchive, CodeOwner, Job, Node, utcnow


def store(
    session: Session, data: bytes, limits: codearchive.Limits, owner: Principal
) -> tuple[str, bool]:
    """Check `data` (an ArchiveError says why it is refused) and keep it under its
    digest as `owner`'s; returns the digest and whether it was new to the owner
    (whether someone else holds the same code is nobody else's business)."""
    if owner.user_id is None:
        raise ValueError("only users upload code")
    user_id = owner.user_id
    codearchive.check(data, limits)
    digest = codearchive.digest_of(data)
    known = session.get(CodeArchive, digest)
    if known is not None:
        known.uploaded_at = utcnow()
    else:
        session.add(CodeArchive(digest=digest, size=len(data), data=data))
        session.flush()
    if session.get(CodeOwner, (digest, user_id)) is not None:
        return digest, False
    session.add(CodeOwner(digest=digest, user_id=user_id))
    session.flush()
    return digest, True


def owned(session: Session, digest: str, user: Principal) -> bool:
    """Whether `user` uploaded the archive `digest` (and it is still stored)."""
    mine = exists().where(CodeOwner.digest == digest, CodeOwner.user_id == user.user_id)
    return session.scalar(select(mine)) or False


def archive_of_job(session: Session, job_id: int, digest: str) -> bytes | None:
    """The archive `digest` if job `job_id` names it, else None."""
    return session.scalar(
        select(CodeArchive.data)
        .join(Job, Job.code_digest == CodeArchive.digest)
        .where(Job.id == job_id, CodeArchive.digest == digest)
    )


def archive_for_node(session: Session, job_id: int, node_name: str, digest: str) -> bytes | None:
    """The archive `digest` if job `job_id` names it and was ever placed on node
    `node_name` (what that node's agent may fetch), else None."""
    node_id = session.scalar(select(Node.id).where(Node.name == node_name))
    if node_id is None or not ran_on(session, job_id, node_id):
        return None
    return archive_of_job(session, job_id, digest)


def expire(session: Session, now: datetime, retention_seconds: float) -> int:
    """Delete the archives last uploaded before the retention whose jobs all ended before it
    (or that no job names); returns how many went. A job not ended yet (queued,
    running, suspended) keeps its code, however old."""
    cutoff = now - timedelta(seconds=retention_seconds)
    needed = exists().where(
        Job.code_digest == CodeArchive.digest,
        or_(Job.finished_at.is_(None), Job.finished_at > cutoff),
    )
    result = session.execute(
        delete(CodeArchive)
        .where(CodeArchive.uploaded_at < cutoff, ~needed)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)
