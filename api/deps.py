"""Request dependencies: the session factory and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiProblem
from scheduler.models.users import USER_SCOPE, Principal, TokenVerifier


def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


Factory = Annotated[sessionmaker[Session], Depends(get_factory)]


# RFC 6750: a 401 names the scheme the client should use.
_CHALLENGE = {"WWW-Authenticate": "Bearer"}

# Declares the scheme in the OpenAPI schema (and the docs' Authorize button); the header
# itself is checked by `authenticate`, so that every failure has this API's error body.
_bearer_scheme = HTTPBearer(auto_error=False, description="A token from `jigsaw token create`.")


def authenticate(tokens: TokenVerifier, authorization: str) -> Principal:
    """The principal of an `Authorization: Bearer <token>` header, or ApiProblem 401."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiProblem(
            401,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers=_CHALLENGE,
        )
    principal = tokens.verify(token.strip())
    if principal is None:
        raise ApiProblem(401, "invalid or revoked token (or it has expired)", headers=_CHALLENGE)
    return principal


def get_principal(
    request: Request, _scheme: Annotated[object, Depends(_bearer_scheme)]
) -> Principal:
    # api.guards authenticated /v1 requests before their body was read.
    principal = getattr(request.state, "principal", None)
    if isinstance(principal, Principal):
        return principal
    tokens: TokenVerifier = request.app.state.tokens
    return authenticate(tokens, request.headers.get("authorization", ""))


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
