"""The HTTP API against what an attacker or an unlucky user sends: actions in the wrong
state, NUL characters, NaN, oversized and anonymous bodies, trailing newlines, duplicate
keys, deep nesting and coerced types. Real uvicorn on loopback, SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import func, select, update

from scheduler.core.states import TERMINAL, JobState
from scheduler.db import session_factory
from scheduler.dispatch import SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.orm import GPU, Agent, Event, Job, Node
from scheduler.settings import APISettings, SchedulerSettings
from tests.conftest import LiveApi

SPEC: dict[str, Any] = {"name": "digits", "workload": "digits-mlp", "max_iterations": 50}
MIB = 1024 * 1024


def _submit(client: httpx.Client, **patch: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={**SPEC, **patch})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _locs(response: httpx.Response) -> list[str]:
    return [detail["loc"] for detail in response.json()["error"]["details"]]


# -- item 5: every action against every state -------------------------------------------

# Written out here, not read from the code under test: which states each user action
# may start from, and where it leads.
ACTIONS: dict[str, tuple[set[JobState], JobState]] = {
    "cancel": (set(JobState) - TERMINAL, JobState.CANCELLED),
    "suspend": ({JobState.RUNNING}, JobState.SUSPENDED),
    "resume": ({JobState.SUSPENDED}, JobState.QUEUED),
}


def test_every_action_endpoint_is_in_the_table(live_api: LiveApi) -> None:
    paths = live_api.get("/openapi.json").json()["paths"]
    actions = {
        path.rsplit("/", 1)[1]
        for path, operations in paths.items()
        if path.startswith("/v1/jobs/{job_id}/") and "post" in operations
    }
    assert actions == set(ACTIONS)


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_action_in_every_state_changes_only_what_it_may(live_api: LiveApi, action: str) -> None:
    sources, target = ACTIONS[action]
    factory = session_factory(live_api.engine)
    with live_api.client(live_api.alice) as alice:
        for state in JobState:
            job_id = _submit(alice, name=f"{action}-{state.value.lower()}")["id"]
            with factory() as session, session.begin():
                session.execute(update(Job).where(Job.id == job_id).values(state=state.value))
            with factory() as session:
                events_before = session.scalar(
                    select(func.count()).select_from(Event).where(Event.job_id == job_id)
                )
            response = alice.post(f"/v1/jobs/{job_id}/{action}")
            with factory() as session:
                job = session.get_one(Job, job_id)
                events_after = session.scalar(
                    select(func.count()).select_from(Event).where(Event.job_id == job_id)
                )
            if state in sources:
                assert response.status_code == 200, (action, state, response.text)
                assert job.state == target.value
                assert events_after == events_before + 1
            else:
                assert response.status_code == 409, (action, state, response.text)
                assert state.value in response.json()["error"]["message"]
                assert job.state == state.value, (action, state)
                assert job.message == "" and events_after == events_before


# -- item 6: NUL and NaN ------------------------------------------------------------------


def test_nul_in_path_query_or_body_is_422_with_where(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice, live_api.client(live_api.root) as root:
        response = alice.get("/v1/jobs?owner=%00")
        assert response.status_code == 422 and _locs(response) == ["query.owner"]
        response = alice.get("/v1/jobs?owner=al%00ice&limit=5")
        assert response.status_code == 422 and _locs(response) == ["query.owner"]
        response = alice.get("/v1/profiles/%00")
        assert response.status_code == 422 and _locs(response) == ["path"]
        trial = {**SPEC, "workload": "mine.trials:Trial"}
        response = alice.post(
            "/v1/jobs", json={**trial, "target_metric": {"name": "acc\x00", "value": 1}}
        )
        assert response.status_code == 422 and _locs(response) == ["target_metric.name"]
        response = root.put(
            "/v1/profiles/digits-mlp",
            json={
                "per_worker_batch": 8,
                "device_kind": "gpu\x00",
                "stages": [
                    {
                        "forward_seconds": 1,
                        "backward_input_seconds": 1,
                        "backward_weight_seconds": 1,
                        "activation_bytes": 1,
                        "parameter_bytes": 1,
                    }
                ],
            },
        )
        assert response.status_code == 422 and _locs(response) == ["device_kind"]
        assert alice.get("/v1/jobs").json()["total"] == 0
        assert root.get("/v1/profiles").json()["items"] == []


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_in_a_spec_are_422(live_api: LiveApi, literal: str) -> None:
    body = json.dumps({**SPEC, "target_metric": {"name": "accuracy", "value": 0.5}})
    body = body.replace("0.5", literal)
    with live_api.client(live_api.alice) as alice:
        response = alice.post(
            "/v1/jobs", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 422, response.text
        assert _locs(response) == ["target_metric.value"]
        nan_rate = json.dumps({**SPEC, "hyperparameters": {"learning_rate": 0.5}})
        response = alice.post(
            "/v1/jobs",
            content=nan_rate.replace("0.5", literal),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 422 and _locs(response) == ["hyperparameters.learning_rate"]
        assert alice.get("/v1/jobs").json()["total"] == 0


# -- item 8: bodies too large, and anonymous ones, are not read -----------------------------


def _raw(live_api: LiveApi, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send `head` (and `body`) on a fresh connection and read the answer: the server
    must answer without waiting for the rest of a body it was promised."""
    parts = urlsplit(live_api.base_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=20) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        received = b""
        while b"\r\n\r\n" not in received or len(received) < received.index(b"\r\n\r\n") + 4:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    status = int(received.split(b" ", 2)[1])
    return status, received.partition(b"\r\n\r\n")[2]


def test_a_body_over_the_limit_is_413_unread(live_api: LiveApi) -> None:
    for token in (None, live_api.alice):
        auth = f"Authorization: Bearer {token}\n" if token else ""
        # 200 MB promised, none sent: answered at once.
        status, body = _raw(
            live_api,
            f"POST /v1/jobs HTTP/1.1\nHost: x\n{auth}Content-Type: application/json\n"
            f"Content-Length: {200 * MIB}\n",
        )
        assert status == 413
        assert json.loads(body)["error"]["status"] == 413
    # Chunked, no length given: refused once what arrived passes the limit.
    chunk = 64 * 1024
    chunks = b"".join(b"%x\r\n" % chunk + b" " * chunk + b"\r\n" for _ in range(MIB // chunk + 1))
    status, _ = _raw(
        live_api,
        f"POST /v1/jobs HTTP/1.1\nHost: x\nAuthorization: Bearer {live_api.alice}\n"
        "Content-Type: application/json\nTransfer-Encoding: chunked\n",
        chunks,
    )
    assert status == 413
    with live_api.client(live_api.alice) as alice:
        # Under the limit, the same route reads and judges the body as usual.
        padded = json.dumps({**SPEC, "padding": "x" * (MIB // 2)})
        response = alice.post(
            "/v1/jobs", content=padded, headers={"content-type": "application/json"}
        )
        assert response.status_code == 422 and _locs(response) == ["padding"]
        assert alice.get("/v1/jobs").json()["total"] == 0


def test_authentication_comes_before_the_body(live_api: LiveApi) -> None:
    # A body is promised but never sent: only a server that authenticates first answers.
    for auth in ("", "Authorization: Bearer jsu_forged\n"):
        status, body = _raw(
            live_api,
            f"POST /v1/jobs HTTP/1.1\nHost: x\n{auth}Content-Type: application/json\n"
            "Content-Length: 1000\n",
        )
        assert status == 401
        assert json.loads(body)["error"]["status"] == 401


# -- item 10: trailing newlines, duplicate keys, deep nesting, coercion, metric names ------


def _refused(live_api: LiveApi, cases: list[tuple[dict[str, Any], str]]) -> None:
    with live_api.client(live_api.alice) as alice:
        for payload, loc in cases:
            response = alice.post("/v1/jobs", json=payload)
            assert response.status_code == 422, (payload, response.text)
            assert loc in _locs(response), (payload, response.json())
        assert alice.get("/v1/jobs").json()["total"] == 0


def test_trailing_newlines_are_refused(live_api: LiveApi) -> None:
    _refused(
        live_api,
        [
            ({**SPEC, "name": "job\n"}, "name"),
            ({**SPEC, "queue": "default\n"}, "queue"),
            ({**SPEC, "workload": "a:B\n"}, "workload"),
        ],
    )


def test_spec_types_are_strict(live_api: LiveApi) -> None:
    _refused(
        live_api,
        [
            ({**SPEC, "workers": "2"}, "workers"),
            ({**SPEC, "workers": True}, "workers"),
            ({**SPEC, "max_iterations": "50"}, "max_iterations"),
            (
                {**SPEC, "hyperparameters": {"learning_rate": "0.1"}},
                "hyperparameters.learning_rate",
            ),
            ({**SPEC, "hyperparameters": {"batch_size": 64.0}}, "hyperparameters.batch_size"),
        ],
    )
    with live_api.client(live_api.alice) as alice:
        accepted = _submit(alice, workers=2, hyperparameters={"learning_rate": 1})
        assert accepted["spec"]["hyperparameters"]["learning_rate"] == 1.0  # an int is a float


def test_target_metric_of_a_builtin_workload_must_be_one_it_reports(live_api: LiveApi) -> None:
    _refused(
        live_api,
        [
            ({**SPEC, "target_metric": {"name": "perplexity", "value": 2}}, "target_metric"),
            (
                {
                    **SPEC,
                    "workload": "text-transformer",
                    "target_metric": {"name": "accuracy", "value": 0.9},
                },
                "target_metric",
            ),
        ],
    )
    with live_api.client(live_api.alice) as alice:
        _submit(alice, target_metric={"name": "accuracy", "value": 0.9})
        _submit(alice, workload="mine.trials:Trial", target_metric={"name": "bleu", "value": 9})


def test_duplicate_keys_and_deep_nesting_are_422(live_api: LiveApi) -> None:
    json_headers = {"content-type": "application/json"}
    with live_api.client(live_api.alice) as alice:
        duplicated = '{"name": "a", "workload": "digits-mlp", "max_iterations": 5, "name": "b"}'
        response = alice.post("/v1/jobs", content=duplicated, headers=json_headers)
        assert response.status_code == 422
        assert response.json()["error"]["details"] == [
            {"loc": "name", "message": "duplicate key 'name'"}
        ]
        nested = json.dumps({**SPEC, "hyperparameters": {"batch_size": 8}})
        nested = nested.replace('"batch_size": 8', '"batch_size": 8, "batch_size": 16')
        response = alice.post("/v1/jobs", content=nested, headers=json_headers)
        assert _locs(response) == ["hyperparameters.batch_size"]
        for depth in (40, 100_000):
            deep = '{"name": "a", "x": ' + "[" * depth + "]" * depth + "}"
            response = alice.post("/v1/jobs", content=deep, headers=json_headers)
            assert response.status_code == 422, (depth, response.text[:200])
            assert "nested deeper" in response.json()["error"]["message"]
        assert alice.get("/v1/jobs").json()["total"] == 0


# -- item 11: a job no capacity can hold ----------------------------------------------------


def _register_gpus(live_api: LiveApi, count: int) -> None:
    with session_factory(live_api.engine)() as session, session.begin():
        node = Node(name="node-a")
        session.add(node)
        session.flush()
        session.add_all(
            GPU(node_id=node.id, index=i, kind="H100", memory_bytes=80 << 30) for i in range(count)
        )
        session.add(Agent(node_id=node.id, version="1"))


def test_a_job_larger_than_every_registered_gpu_is_refused(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice:
        _submit(alice, workers=8)  # no GPU registered yet: the cluster's size is unknown
        _register_gpus(live_api, 4)
        response = alice.post("/v1/jobs", json={**SPEC, "workers": 8})
        assert response.status_code == 422
        [detail] = response.json()["error"]["details"]
        assert detail["loc"] == "workers"
        assert detail["message"].startswith("needs 8 GPUs; the cluster has registered 4")
        assert _submit(alice, workers=4)["pending_reason"] is None
        assert alice.get("/v1/jobs").json()["total"] == 2


@pytest.mark.parametrize("live_api_settings", [{"api": APISettings(refuse_unplaceable=False)}])
def test_with_refusal_off_it_waits_with_its_reason_shown(live_api: LiveApi) -> None:
    _register_gpus(live_api, 4)
    with live_api.client(live_api.alice) as alice:
        job = _submit(alice, workers=8)
        factory = session_factory(live_api.engine)
        SchedulerService(
            factory, SimulatedDispatcher(10), SchedulerSettings(policy="fifo")
        ).run_round()
        shown = alice.get(f"/v1/jobs/{job['id']}").json()
        assert shown["state"] == "QUEUED"
        assert shown["pending_reason"] == (
            "needs 8 GPUs; the largest gang this cluster can form is 4"
        )
        assert alice.get("/v1/jobs").json()["items"][0]["pending_reason"] == shown["pending_reason"]
        events = alice.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        assert [e["message"] for e in events if e["kind"] == "pending"] == [shown["pending_reason"]]
        cancelled = alice.post(f"/v1/jobs/{job['id']}/cancel").json()
        assert cancelled["pending_reason"] is None  # it no longer waits


# -- item 12: docs offline, the schema says what the API does -------------------------------


def test_docs_are_served_offline(live_api: LiveApi) -> None:
    with live_api.client(None) as anonymous:
        for page in ("/docs", "/redoc"):
            html = anonymous.get(page)
            assert html.status_code == 200
            assert "http://" not in html.text and "https://" not in html.text, page
            for asset in re.findall(r'(?:src|href)="([^"]+)"', html.text):
                assert anonymous.get(asset).status_code == 200, asset


def test_openapi_declares_bearer_auth_and_every_error(live_api: LiveApi) -> None:
    openapi = live_api.get("/openapi.json").json()
    assert openapi["components"]["securitySchemes"] == {
        "HTTPBearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `jigsaw token create`.",
        }
    }
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in openapi["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            assert operation["security"] == [{"HTTPBearer": []}], (method, path)
            responses = operation["responses"]
            for status in ("401", "403", "413", "422"):
                schema = responses[status]["content"]["application/json"]["schema"]
                assert schema == error_body, (method, path, status)
    jobs = openapi["paths"]["/v1/jobs/{job_id}/resume"]["post"]["responses"]
    assert {"404", "409"} <= set(jobs)
    assert "400" in openapi["paths"]["/v1/jobs"]["post"]["responses"]


def test_method_not_allowed_names_every_method_of_the_path(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice:
        response = alice.delete("/v1/jobs")
        assert response.status_code == 405
        assert response.headers["allow"] == "GET, POST"
        assert alice.request("OPTIONS", "/v1/profiles/x").headers["allow"] == "GET, PUT"
