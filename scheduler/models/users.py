"""Users and bearer tokens. Tokens are random and stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from cachetools import TTLCache
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import transaction
from scheduler.orm import ApiToken, User

USER_SCOPE = "user"
AGENT_SCOPE = "agent"
_TOKEN_PREFIX = {USER_SCOPE: "jsu_", AGENT_SCOPE: "jsa_"}


def hash_token(token: str) -> str:
    # Tokens carry 256 bits of randomness, so a fast unsalted hash is enough: there is no
    # dictionary to attack, and lookups stay a single indexed equality.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    scope: str
    user_id: int | None
    user_name: str
    is_admin: bool


def get_or_create_user(session: Session, name: str, *, is_admin: bool = False) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(name=name, is_admin=is_admin)
        session.add(user)
        session.flush()
    elif is_admin and not user.is_admin:
        user.is_admin = True
    return user


def issue_token(
    session: Session, *, scope: str, user: User | None = None, description: str = ""
) -> str:
    """Create a token and return it in clear; only its hash is stored."""
    if scope not in _TOKEN_PREFIX:
        raise ValueError(f"unknown token scope {scope!r}")
    if (scope == USER_SCOPE) != (user is not None):
        raise ValueError("user tokens need a user; agent tokens must not have one")
    token = _TOKEN_PREFIX[scope] + secrets.token_urlsafe(32)
    session.add(
        ApiToken(
            token_hash=hash_token(token),
            prefix=token[:8],
            scope=scope,
            user_id=user.id if user else None,
            description=description,
        )
    )
    session.flush()
    return token


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal a bearer token stands for, or None if unknown or revoked."""
    row = session.execute(
        select(ApiToken, User)
        .outerjoin(User, ApiToken.user_id == User.id)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    api_token, user = row
    if api_token.scope == AGENT_SCOPE:
        return Principal(scope=AGENT_SCOPE, user_id=None, user_name="agent", is_admin=False)
    assert user is not None  # user-scope tokens always reference a user (issue_token)
    return Principal(scope=USER_SCOPE, user_id=user.id, user_name=user.name, is_admin=user.is_admin)


class TokenVerifier:
    """Bearer tokens verified against the database, the good ones cached for `seconds`.

    A request then costs one transaction, not two; a revoked token stops working within
    `seconds`. Unknown tokens are never cached, so a forged token cannot evict real ones.
    """

    def __init__(self, factory: sessionmaker[Session], seconds: float) -> None:
        self._factory = factory
        self._cache: TTLCache[str, Principal] | None = (
            TTLCache(maxsize=4096, ttl=seconds) if seconds > 0 else None
        )

    def verify(self, token: str) -> Principal | None:
        principal = self._cache.get(token) if self._cache is not None else None
        if principal is None:
            with transaction(self._factory) as session:
                principal = authenticate(session, token)
            if principal is not None and self._cache is not None:
                self._cache[token] = principal
        return principal
