"""Request dependencies: the session factory and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiProblem
from scheduler.models.users import USER_SCOPE, Principal, TokenVerifier


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


def get_principal(request: Request) -> Principal:
    token = _bearer(request)
    tokens: TokenVerifier = request.app.state.tokens
    principal = tokens.verify(token)
    if principal is None:
        raise ApiProblem(401, "invalid or revoked token (or it has expired)", headers=_CHALLENGE)
    return principal


def get_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """A user (not an agent) principal; agents' cluster token cannot use the user API."""
    if principal.scope != USER_SCOPE:
        raise ApiProblem(403, "agent tokens cannot use the user API")
    return principal


User = Annotated[Principal, Depends(get_user)]


def get_admin(user: User) -> Principal:
    """An admin user; anyone else gets 403."""
    if not user.is_admin:
        raise ApiProblem(403, "only admins may do this")
    return user


Admin = Annotated[Principal, Depends(get_admin)]
