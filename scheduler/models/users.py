"""Users and bearer tokens. Tokens are random and stored only as SHA-256 hashes.

A token may expire (`expires_at`) and be revoked (`revoked_at`); either refuses it from
then on. Who may see and revoke which tokens: admins every token, users their own (a
user can only ever give up access, never gain it). Only admins issue tokens through the
API (`jigsaw token create` on the database is the operator's way in).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from cachetools import TTLCache
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import transaction
from scheduler.orm import ApiToken, User, utcnow

USER_SCOPE = "user"
AGENT_SCOPE = "agent"
_TOKEN_PREFIX = {USER_SCOPE: "jsu_", AGENT_SCOPE: "jsa_"}
USER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# What listings show of a token and `revoke` takes: its scope marker and 8 random
# characters (48 bits: prefixes of one cluster's tokens do not collide in practice).
PREFIX_CHARS = 12
# `last_used_at` is written at most this often per token: authentication must not add
# a database write to every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(token: str) -> str:
    # Tokens carry 256 bits of randomness, so a fast unsalted hash is enough: there is no
    # dictionary to attack, and lookups stay a single indexed equality.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request acts as (`token_id`: the token it presented, when known)."""

    scope: str
    user_id: int | None
    user_name: str
    is_admin: bool
    token_id: int | None = None


@dataclass(frozen=True)
class TokenInfo:
    """What a listing shows of a token (never the token, which is not stored)."""

    id: int
    prefix: str
    scope: str
    user_name: str | None  # None for agent (cluster) tokens
    description: str
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenNotFound(LookupError):
    """No token the caller may see has this prefix (or it is revoked already)."""


class AmbiguousPrefix(LookupError):
    """Several active tokens share the prefix: a longer one is needed."""


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
    session: Session,
    *,
    scope: str,
    user: User | None = None,
    description: str = "",
    expires_at: datetime | None = None,
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
            prefix=token[:PREFIX_CHARS],
            scope=scope,
            user_id=user.id if user else None,
            description=description,
            expires_at=expires_at,
        )
    )
    session.flush()
    return token


@dataclass(frozen=True)
class _Verified:
    principal: Principal
    expires_at: datetime | None


def _verify(session: Session, token: str, now: datetime) -> _Verified | None:
    """The token's principal and expiry, or None if unknown, revoked or expired; notes
    its use (at most once per LAST_USED_RESOLUTION)."""
    row = session.execute(
        select(ApiToken, User)
        .outerjoin(User, ApiToken.user_id == User.id)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    api_token, user = row
    if api_token.expires_at is not None and api_token.expires_at <= now:
        return None
    if api_token.last_used_at is None or now - api_token.last_used_at >= LAST_USED_RESOLUTION:
        api_token.last_used_at = now
    if api_token.scope == AGENT_SCOPE:
        principal = Principal(AGENT_SCOPE, None, "agent", False, api_token.id)
    else:
        assert user is not None  # user-scope tokens always reference a user (issue_token)
        principal = Principal(USER_SCOPE, user.id, user.name, user.is_admin, api_token.id)
    return _Verified(principal, api_token.expires_at)


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal a bearer token stands for, or None if unknown, revoked or expired."""
    verified = _verify(session, token, utcnow())
    return verified.principal if verified is not None else None


def list_tokens(
    session: Session, viewer: Principal, *, user_name: str | None = None, revoked: bool = False
) -> list[TokenInfo]:
    """Tokens the viewer may see (admins: all, or `user_name`'s; users: their own),
    oldest first; revoked ones only when asked."""
    query = (
        select(ApiToken, User.name)
        .outerjoin(User, ApiToken.user_id == User.id)
        .order_by(ApiToken.id)
    )
    if not viewer.is_admin:
        query = query.where(ApiToken.user_id == viewer.user_id)
    if user_name is not None:
        query = query.where(User.name == user_name)
    if not revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return [_info(token, name) for token, name in session.execute(query)]


def token_info(session: Session, token: str) -> TokenInfo:
    """How listings show this (existing) token."""
    row = session.execute(
        select(ApiToken, User.name)
        .outerjoin(User, ApiToken.user_id == User.id)
        .where(ApiToken.token_hash == hash_token(token))
    ).one()
    return _info(*row)


def revoke_token(session: Session, key: str, viewer: Principal) -> TokenInfo:
    """Revoke the one active token the viewer may see whose prefix is `key` (or, when
    `key` is all digits, whose id is: prefixes never are).

    Raises TokenNotFound or AmbiguousPrefix. Verifiers elsewhere refuse it once their
    cache entry expires; the caller's own verifier should `forget` it at once.
    """
    match = ApiToken.id == int(key) if key.isdigit() else ApiToken.prefix == key
    query = (
        select(ApiToken, User.name)
        .outerjoin(User, ApiToken.user_id == User.id)
        .where(match, ApiToken.revoked_at.is_(None))
    )
    if not viewer.is_admin:
        query = query.where(ApiToken.user_id == viewer.user_id)
    rows = session.execute(query.with_for_update(of=ApiToken)).all()
    if not rows:
        raise TokenNotFound(key)
    if len(rows) > 1:
        raise AmbiguousPrefix(key)
    token, name = rows[0]
    token.revoked_at = utcnow()
    session.flush()
    return _info(token, name)


def _info(token: ApiToken, user_name: str | None) -> TokenInfo:
    return TokenInfo(
        id=token.id,
        prefix=token.prefix,
        scope=token.scope,
        user_name=user_name,
        description=token.description,
        created_at=token.created_at,
        last_used_at=token.last_used_at,
        expires_at=token.expires_at,
        revoked_at=token.revoked_at,
    )


class TokenVerifier:
    """Bearer tokens verified against the database, the good ones cached for `seconds`.

    A request then costs one transaction, not two; a token revoked elsewhere stops
    working here within `seconds`, one revoked through this process at once (`forget`);
    an expired one at its expiry. Unknown tokens are never cached, so a forged token
    cannot evict real ones. Entries are keyed by the token's hash, not the token.
    Thread-safe: HTTP handlers and gRPC threads share one verifier.
    """

    def __init__(self, factory: sessionmaker[Session], seconds: float) -> None:
        self._factory = factory
        self.seconds = seconds
        self._lock = threading.Lock()
        self._cache: TTLCache[str, _Verified] | None = (
            TTLCache(maxsize=4096, ttl=seconds) if seconds > 0 else None
        )
        # Bumped by every `forget`, so long-lived streams re-check their token at once.
        self.revision = 0

    def verify(self, token: str) -> Principal | None:
        key = hash_token(token)
        now = utcnow()
        with self._lock:
            hit = self._cache.get(key) if self._cache is not None else None
        if hit is not None and (hit.expires_at is None or hit.expires_at > now):
            return hit.principal
        with transaction(self._factory) as session:
            verified = _verify(session, token, now)
        with self._lock:
            if self._cache is not None:
                if verified is not None:
                    self._cache[key] = verified
                else:
                    self._cache.pop(key, None)
        return verified.principal if verified is not None else None

    def forget(self, token_id: int) -> None:
        """Drop the cached verdict on a token (just revoked): refused from now on."""
        with self._lock:
            self.revision += 1
            if self._cache is None:
                return
            for key, verified in list(self._cache.items()):
                if verified.principal.token_id == token_id:
                    del self._cache[key]
