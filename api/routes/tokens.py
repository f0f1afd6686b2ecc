"""/v1/tokens: list, issue and revoke bearer tokens.

Admins see, issue and revoke every token; a user sees and revokes only their own (giving
up access is always allowed; gaining it is the admins' call). A token revoked here is
refused at once by this process (HTTP and the agents' gRPC endpoint), and by other
replicas within JIGSAW_API_AUTH_CACHE_SECONDS.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from api.deps import Admin, Factory, User
from api.errors import ApiProblem
from api.schemas import (
    USER_NAME_PATTERN,
    V1_ERRORS,
    TokenCreated,
    TokenIn,
    TokenOut,
    TokenPage,
    error_responses,
)
from scheduler.db import transaction
from scheduler.models.users import (
    AGENT_SCOPE,
    USER_SCOPE,
    AmbiguousPrefix,
    TokenNotFound,
    TokenVerifier,
    get_or_create_user,
    issue_token,
    list_tokens,
    revoke_token,
    token_info,
)
from scheduler.orm import utcnow

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=V1_ERRORS)

TokenKey = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9_-]{1,16}$",
        description="The token's prefix, or its id (for prefixes that several share), as "
        "`GET /v1/tokens` shows them.",
    ),
]


@router.get("")
def tokens(
    user: User,
    factory: Factory,
    owner: Annotated[
        str | None,
        Query(alias="user", pattern=USER_NAME_PATTERN, description="Only this user's (admins)."),
    ] = None,
    revoked: Annotated[bool, Query(description="Include revoked tokens.")] = False,
) -> TokenPage:
    """Tokens the caller may see: all for admins, else the caller's own."""
    if owner is not None and owner != user.user_name and not user.is_admin:
        raise ApiProblem(403, "only admins may list other users' tokens")
    with transaction(factory) as session:
        rows = list_tokens(session, user, user_name=owner, revoked=revoked)
    return TokenPage(items=[TokenOut.of(row) for row in rows])


@router.post("", status_code=201, responses=error_responses(400))
def create_token(body: TokenIn, admin: Admin, factory: Factory) -> TokenCreated:
    """Issue a token (admins); the response is the only time the token is shown."""
    expires_at = (
        utcnow() + timedelta(seconds=body.expires_in_seconds)
        if body.expires_in_seconds is not None
        else None
    )
    with transaction(factory) as session:
        if body.user is None:
            token = issue_token(
                session, scope=AGENT_SCOPE, description=body.description, expires_at=expires_at
            )
        else:
            owner = get_or_create_user(session, body.user, is_admin=body.admin)
            token = issue_token(
                session,
                scope=USER_SCOPE,
                user=owner,
                description=body.description,
                expires_at=expires_at,
            )
        info = token_info(session, token)
    return TokenCreated(**TokenOut.of(info).model_dump(), token=token)


@router.delete("/{key}", responses=error_responses(404, 409))
def revoke(key: TokenKey, request: Request, user: User, factory: Factory) -> TokenOut:
    """Revoke the active token with this prefix or id (404: none the caller may see;
    409: several share the prefix, so give the id)."""
    try:
        with transaction(factory) as session:
            info = revoke_token(session, key, user)
    except TokenNotFound:
        raise ApiProblem(404, f"no active token {key!r} that you may revoke") from None
    except AmbiguousPrefix:
        raise ApiProblem(
            409, f"several active tokens have prefix {key!r}: revoke by id instead"
        ) from None
    verifier: TokenVerifier = request.app.state.tokens
    verifier.forget(info.id)
    return TokenOut.of(info)
