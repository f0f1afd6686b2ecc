"""/v1/code: upload a job's code archive; a job spec then names it as `code: sha256:...`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from api.deps import Factory, User
from api.errors import ApiProblem
from api.schemas import V1_ERRORS
from jigsaw import codearchive
from scheduler.db import transaction
from scheduler.models import code as code_models

PATH = "/v1/code"
router = APIRouter(prefix=PATH, tags=["code"], responses=V1_ERRORS)


class CodeOut(BaseModel):
    digest: str
    size: int


def limits_of(request: Request) -> codearchive.Limits:
    return codearchive.Limits(max_bytes=request.app.state.settings.api.max_code_bytes)


@router.post(
    "",
    status_code=201,
    responses={200: {"model": CodeOut, "description": "Already stored."}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_code(
    request: Request, response: Response, user: User, factory: Factory
) -> CodeOut:
    """Store a gzipped tar of a job's code (`jigsaw submit --code DIR` makes one) and
    answer its digest for the spec's `code`. Larger than JIGSAW_API_MAX_CODE_BYTES: 413;
    not a tar of regular files and directories under relative paths: 422. Idempotent:
    the same archive again from the same user is 200 with the same digest. The archive
    is the uploader's: a spec may name only code its submitter uploaded."""
    data = await request.body()
    try:
        with transaction(factory) as session:
            digest, new = code_models.store(session, data, limits_of(request), user)
    except codearchive.ArchiveError as exc:
        raise ApiProblem(
            422, f"invalid code archive: {exc}", [{"loc": "body", "message": str(exc)}]
        ) from None
    if not new:
        response.status_code = 200
    return CodeOut(digest=digest, size=len(data))
