"""Request dependencies: the session factory and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from cachetools import TTLCache
from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiProblem
from scheduler.db import transaction
from scheduler.models.users import USER_SCOPE, Principal, authenticate


def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


Factory = Annotated[sessionmaker[Session], Depends(get_factory)]


# RFC 6750: a 401 names the scheme the client should use.
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiProblem(
            401,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers=_CHALLENGE,
        )
    return token.strip()


def get_principal(request: Request, factory: Factory) -> Principal:
    token = _bearer(request)
    cache: TTLCache[str, Principal] | None = request.app.state.auth_cache
    principal = cache.get(token) if cache is not None else None
    if principal is None:
        with transaction(factory) as session:
            principal = authenticate(session, token)
        if principal is None:
            # Unknown tokens are never cached: a forged token cannot evict real ones.
            raise ApiProblem(401, "invalid or revoked token", headers=_CHALLENGE)
        if cache is not None:
            cache[token] = principal
    return principal


def make_auth_cache(seconds: float) -> TTLCache[str, Principal] | None:
    """Verified tokens, so a request costs one transaction, not two (see settings)."""
    return TTLCache(maxsize=4096, ttl=seconds) if seconds > 0 else None


def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """A user (not an agent) principal; agents' cluster token cannot use the user API."""
    if principal.scope != USER_SCOPE:
        raise ApiProblem(403, "agent tokens cannot use the user API")
    return principal


User = Annotated[Principal, Depends(get_user)]
