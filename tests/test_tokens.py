"""Tokens can be listed, revoked and expire, on both databases, over live HTTP and gRPC.

Two app instances on one database stand for two replicas: `here` trusts a verified token
for a minute (so only an explicit eviction explains an immediate refusal there), while
`elsewhere` caches for SHORT seconds, after which it must refuse a token revoked `here`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, event, select

from api.app import create_app
from jigsaw.proto.v2 import agent_pb2 as pb
from scheduler.db import session_factory, transaction
from scheduler.models.users import (
    AGENT_SCOPE,
    PREFIX_CHARS,
    USER_SCOPE,
    get_or_create_user,
    issue_token,
)
from scheduler.orm import ApiToken
from scheduler.settings import APISettings, DatabaseSettings, Settings
from tests.agent_endpoint import agent_endpoint
from tests.servers import HTTP_TIMEOUT_SECONDS, serve_app
from tests.test_agent_protocol import Stream, hello, register_request

SHORT = 0.5  # seconds the `elsewhere` replica trusts a verified token
LONG = 60.0  # ... and the `here` replica


@dataclass
class Replicas:
    here: str
    elsewhere: str
    apps: dict[str, FastAPI]
    tokens: dict[str, str]  # user (or "agent") -> token
    engine: Engine

    def get(self, url: str, who: str, path: str = "/v1/whoami", **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, who, path, **kwargs)

    def request(self, method: str, url: str, who: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(
            method, url + path, headers=self.auth(who), timeout=HTTP_TIMEOUT_SECONDS, **kwargs
        )

    def auth(self, who: str) -> dict[str, str]:
        token = self.tokens.get(who, who)
        return {"Authorization": f"Bearer {token}"}


def _app(db_url: str, home: Path, cache_seconds: float) -> FastAPI:
    return create_app(
        Settings(
            home=home,
            database=DatabaseSettings(url=db_url),
            api=APISettings(auth_cache_seconds=cache_seconds),
        )
    )


@pytest.fixture
def replicas(engine: Engine, db_url: str, tmp_path: Path) -> Iterator[Replicas]:
    with transaction(session_factory(engine)) as session:
        tokens = {
            name: issue_token(
                session,
                scope=USER_SCOPE,
                user=get_or_create_user(session, name, is_admin=admin),
                description=f"{name}'s laptop",
            )
            for name, admin in (("alice", False), ("bob", False), ("root", True))
        }
        tokens["agent"] = issue_token(session, scope=AGENT_SCOPE, description="cluster")
    apps = {"here": _app(db_url, tmp_path, LONG), "elsewhere": _app(db_url, tmp_path, SHORT)}
    try:
        with serve_app(apps["here"]) as here, serve_app(apps["elsewhere"]) as elsewhere:
            yield Replicas(here, elsewhere, apps, tokens, engine)
    finally:
        for app in apps.values():
            app.state.engine.dispose()


def _by_user(page: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    return {item["user"]: item for item in page["items"]}


def test_admins_list_every_token_users_their_own_never_the_secret(replicas: Replicas) -> None:
    r = replicas
    listing = r.get(r.here, "root", "/v1/tokens")
    assert listing.status_code == 200
    tokens = _by_user(listing.json())
    assert set(tokens) == {"alice", "bob", "root", None}
    for who, item in (("alice", tokens["alice"]), ("agent", tokens[None])):
        assert item["prefix"] == r.tokens[who][:PREFIX_CHARS]
        assert item["expires_at"] is None and item["revoked_at"] is None
        assert datetime.fromisoformat(item["created_at"]) <= datetime.now(UTC)
    assert tokens[None]["kind"] == "agent" and tokens["alice"]["kind"] == "user"
    assert tokens["alice"]["description"] == "alice's laptop"
    # Only what was used carries a last use: root's token just listed them.
    assert tokens["root"]["last_used_at"] is not None
    assert tokens["alice"]["last_used_at"] is None
    for secret in r.tokens.values():
        assert secret not in listing.text

    assert r.get(r.here, "alice").status_code == 200
    assert _by_user(r.get(r.here, "root", "/v1/tokens").json())["alice"]["last_used_at"]
    own = r.get(r.here, "alice", "/v1/tokens").json()["items"]
    assert [item["user"] for item in own] == ["alice"]
    assert r.get(r.here, "alice", "/v1/tokens", params={"user": "bob"}).status_code == 403
    assert r.get(r.here, "agent", "/v1/tokens").status_code == 403


def test_admins_issue_tokens_with_an_expiry_and_users_cannot(replicas: Replicas) -> None:
    r = replicas
    request = {"user": "carol", "expires_in_seconds": 3600, "description": "ci"}
    assert r.request("POST", r.here, "alice", "/v1/tokens", json=request).status_code == 403
    before = datetime.now(UTC)
    created = r.request("POST", r.here, "root", "/v1/tokens", json=request)
    after = datetime.now(UTC)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["user"] == "carol" and body["kind"] == "user" and body["description"] == "ci"
    expires = datetime.fromisoformat(body["expires_at"])
    assert before + timedelta(hours=1) <= expires <= after + timedelta(hours=1)
    assert body["prefix"] == body["token"][:PREFIX_CHARS]
    me = r.get(r.elsewhere, body["token"]).json()
    assert me == {"name": "carol", "is_admin": False}
    for bad in (
        {"kind": "agent", "user": "carol"},
        {"kind": "user"},
        {"user": "carol", "expires_in_seconds": 0},
        {"user": "carol\n"},
        {"kind": "agent", "admin": True},
    ):
        answer = r.request("POST", r.here, "root", "/v1/tokens", json=bad)
        assert answer.status_code == 422, (bad, answer.text)
    agent = r.request("POST", r.here, "root", "/v1/tokens", json={"kind": "agent"})
    assert agent.status_code == 201 and agent.json()["token"].startswith("jsa_")


def test_a_revoked_token_is_refused_at_once_here_and_within_the_cache_period_elsewhere(
    replicas: Replicas,
) -> None:
    r = replicas
    # Both replicas have verified (and cached) alice's token.
    assert r.get(r.here, "alice").status_code == 200
    assert r.get(r.elsewhere, "alice").status_code == 200
    prefix = r.tokens["alice"][:PREFIX_CHARS]
    # Users cannot revoke (or even find) other users' tokens.
    bob_prefix = r.tokens["bob"][:PREFIX_CHARS]
    assert r.request("DELETE", r.here, "alice", f"/v1/tokens/{bob_prefix}").status_code == 404
    assert r.get(r.here, "bob").status_code == 200

    revoked = r.request("DELETE", r.here, "root", f"/v1/tokens/{prefix}")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["user"] == "alice" and revoked.json()["revoked_at"] is not None
    refused = r.get(r.here, "alice")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    time.sleep(SHORT)  # the other replica's cache period
    assert r.get(r.elsewhere, "alice").status_code == 401

    again = r.request("DELETE", r.here, "root", f"/v1/tokens/{prefix}")
    assert again.status_code == 404
    listed = r.get(r.here, "root", "/v1/tokens", params={"revoked": True}).json()
    assert _by_user(listed)["alice"]["revoked_at"] is not None
    assert "alice" not in _by_user(r.get(r.here, "root", "/v1/tokens").json())
    # A user may give up their own token.
    own = r.request("DELETE", r.elsewhere, "bob", f"/v1/tokens/{bob_prefix}")
    assert own.status_code == 200
    assert r.get(r.elsewhere, "bob").status_code == 401
    assert r.request("DELETE", r.here, "root", "/v1/tokens/bad%20key").status_code == 422


def test_revoke_by_id_when_a_prefix_is_shared(replicas: Replicas) -> None:
    r = replicas
    with transaction(session_factory(r.engine)) as session:
        for token in session.scalars(select(ApiToken).where(ApiToken.scope == USER_SCOPE)):
            token.prefix = "jsu_same"  # as old 8-character prefixes might
    answer = r.request("DELETE", r.here, "root", "/v1/tokens/jsu_same")
    assert answer.status_code == 409 and "by id" in answer.json()["error"]["message"]
    assert r.get(r.here, "alice").status_code == 200  # nothing was revoked
    alice = next(
        t for t in r.get(r.here, "root", "/v1/tokens").json()["items"] if t["user"] == "alice"
    )
    assert r.request("DELETE", r.here, "root", f"/v1/tokens/{alice['id']}").status_code == 200
    assert r.get(r.here, "alice").status_code == 401


def test_an_expired_token_is_refused_even_while_cached(replicas: Replicas) -> None:
    r = replicas
    created = r.request(
        "POST", r.here, "root", "/v1/tokens", json={"user": "carol", "expires_in_seconds": 1}
    ).json()
    assert r.get(r.here, created["token"]).status_code == 200  # cached for a minute here
    expires = datetime.fromisoformat(created["expires_at"])
    time.sleep(max((expires - datetime.now(UTC)).total_seconds(), 0.0) + 0.05)
    assert r.get(r.here, created["token"]).status_code == 401
    with transaction(session_factory(r.engine)) as session:
        past = issue_token(
            session,
            scope=USER_SCOPE,
            user=get_or_create_user(session, "dave"),
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        )
    assert r.get(r.elsewhere, past).status_code == 401


def test_last_use_is_written_at_most_once_per_minute(replicas: Replicas) -> None:
    r = replicas
    writes: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE API_TOKENS"):
            writes.append(statement)

    engine = r.apps["elsewhere"].state.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        for _ in range(3):
            assert r.get(r.elsewhere, "alice").status_code == 200
            time.sleep(SHORT)  # each request verifies against the database again
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(writes) == 1


def test_a_revoked_cluster_token_ends_agent_streams_and_refuses_the_agent(
    replicas: Replicas, tmp_path: Path
) -> None:
    """The agents' endpoint of the revoking replica shares its verifier: the open stream
    ends at the agent's next message and its next Register is refused; another replica's
    endpoint ends its stream within its cache period."""
    r = replicas
    here_tokens = r.apps["here"].state.tokens
    elsewhere_tokens = r.apps["elsewhere"].state.tokens
    with (
        agent_endpoint(r.engine, tmp_path / "a", here_tokens) as here,
        agent_endpoint(r.engine, tmp_path / "b", elsewhere_tokens) as elsewhere,
    ):
        here = dataclasses.replace(here, agent_token=r.tokens["agent"])
        elsewhere = dataclasses.replace(elsewhere, agent_token=r.tokens["agent"])
        here.stub.Register(register_request("node-a"), metadata=here.auth())
        elsewhere.stub.Register(register_request("node-b"), metadata=elsewhere.auth())
        streams = {
            "here": Stream(here, hello("node-a")),
            "elsewhere": Stream(elsewhere, hello("node-b")),
        }
        deadline = time.monotonic() + 20
        while not (here.dispatcher.connected() and elsewhere.dispatcher.connected()):
            assert time.monotonic() < deadline, "agents did not connect"
            time.sleep(0.02)

        prefix = r.tokens["agent"][:PREFIX_CHARS]
        assert r.request("DELETE", r.here, "root", f"/v1/tokens/{prefix}").status_code == 200
        heartbeat = pb.AgentMessage(heartbeat=pb.Heartbeat())
        streams["here"].send(heartbeat)
        error = streams["here"].wait_closed()
        assert error is not None and error.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as refused:
            here.stub.Register(register_request("node-a"), metadata=here.auth())
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

        time.sleep(1.0)  # the streams' re-check period (the cache period, at least 1 s)
        streams["elsewhere"].send(heartbeat)
        error = streams["elsewhere"].wait_closed()
        assert error is not None and error.code() is grpc.StatusCode.UNAUTHENTICATED
