"""The REST API over real HTTP (uvicorn on loopback), on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from sqlalchemy import text, update

from scheduler.db import session_factory
from scheduler.models.metrics import record
from scheduler.orm import GPU, Agent, Allocation, Job, Node
from tests.conftest import LiveApi

SPEC: dict[str, Any] = {"name": "digits", "workload": "digits-mlp", "max_iterations": 50}


def _submit(client: httpx.Client, **patch: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={**SPEC, **patch})
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_submit_get_list_cancel(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice:
        job = _submit(alice, workers=2, hyperparameters={"batch_size": 64})
        assert job["state"] == "QUEUED"
        assert job["owner"] == "alice"
        assert job["spec"]["workers"] == 2
        fetched = alice.get(f"/v1/jobs/{job['id']}").json()
        assert fetched["id"] == job["id"] and fetched["name"] == "digits"
        listed = alice.get("/v1/jobs").json()
        assert [j["id"] for j in listed["items"]] == [job["id"]]
        cancelled = alice.post(f"/v1/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["state"] == "CANCELLED"
        assert cancelled.json()["finished_at"] is not None
        again = alice.post(f"/v1/jobs/{job['id']}/cancel")
        assert again.status_code == 409
        assert "CANCELLED" in again.json()["error"]["message"]
        assert alice.get(f"/v1/jobs/{job['id']}").json()["state"] == "CANCELLED"
        events = alice.get(f"/v1/jobs/{job['id']}/events").json()["items"]
        assert [(e["from_state"], e["to_state"]) for e in events] == [
            (None, "QUEUED"),
            ("QUEUED", "CANCELLED"),
        ]
        assert events[1]["actor"] == "alice"


def test_pagination_and_state_filter(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice:
        ids = [_submit(alice, name=f"j{i}")["id"] for i in range(7)]
        alice.post(f"/v1/jobs/{ids[0]}/cancel")
        seen: list[int] = []
        after = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 3}
            if after is not None:
                params["after"] = after
            page = alice.get("/v1/jobs", params=params).json()
            assert page["total"] == 7
            seen += [j["id"] for j in page["items"]]
            pages += 1
            after = page["next_after"]
            if after is None:
                break
        assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
        assert pages == 3
        queued = alice.get("/v1/jobs", params={"state": "QUEUED"}).json()
        assert queued["total"] == 6 and ids[0] not in [j["id"] for j in queued["items"]]
        # A full last page ends the walk: next_after is null, no empty page follows.
        first = alice.get("/v1/jobs", params={"state": "QUEUED", "limit": 3}).json()
        last = alice.get(
            "/v1/jobs", params={"state": "QUEUED", "limit": 3, "after": first["next_after"]}
        ).json()
        assert len(last["items"]) == 3 and last["next_after"] is None
        both = alice.get("/v1/jobs", params=[("state", "QUEUED"), ("state", "CANCELLED")])
        assert both.json()["total"] == 7
        bad = alice.get("/v1/jobs", params={"state": "SLEEPING"})
        assert (
            bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == "query.state.0"
        )


def test_owner_isolation(live_api: LiveApi) -> None:
    with (
        live_api.client(live_api.alice) as alice,
        live_api.client(live_api.bob) as bob,
        live_api.client(live_api.root) as root,
    ):
        job = _submit(alice)
        _submit(bob, name="bobs")
        assert bob.get(f"/v1/jobs/{job['id']}").status_code == 404
        assert bob.post(f"/v1/jobs/{job['id']}/cancel").status_code == 404
        assert bob.get(f"/v1/jobs/{job['id']}/events").status_code == 404
        assert alice.get(f"/v1/jobs/{job['id']}").json()["state"] == "QUEUED"
        assert [j["name"] for j in bob.get("/v1/jobs").json()["items"]] == ["bobs"]
        assert bob.get("/v1/jobs", params={"owner": "alice"}).json()["total"] == 0
        assert root.get("/v1/jobs").json()["total"] == 2
        assert root.get("/v1/jobs", params={"owner": "alice"}).json()["total"] == 1
        assert root.get(f"/v1/jobs/{job['id']}").status_code == 200
        assert root.get("/v1/whoami").json() == {"name": "root", "is_admin": True}


def test_bad_specs_get_422_with_field_path(live_api: LiveApi) -> None:
    cases = [
        ({**SPEC, "foo": 1}, "foo"),
        ({**SPEC, "hyperparameters": {"batch_size": 0}}, "hyperparameters.batch_size"),
        ({**SPEC, "hyperparameters": {"optimizer": "rmsprop"}}, "hyperparameters.optimizer"),
        ({**SPEC, "workload": "no such thing"}, "workload"),
        ({"name": "x", "workload": "digits-mlp"}, "body"),  # no stopping rule
        ({**SPEC, "workers": 8, "hyperparameters": {"batch_size": 4}}, "body"),
        ({**SPEC, "workers": "many"}, "workers"),
        ({**SPEC, "workers": 2, "pipeline": {"stages": 2}}, "pipeline"),  # digits-mlp
        ({**SPEC, "pipeline": {"stages": 2, "schedule": "sideways"}}, "pipeline.schedule"),
        ({**SPEC, "elastic": {"min_workers": 2, "max_workers": 4}}, "elastic"),  # workers 1
        ({**SPEC, "elastic": {"min_workers": 1, "max_workers": 0}}, "elastic.max_workers"),
        ({**SPEC, "batch": {"global": "64"}}, "batch.global"),
        ({**SPEC, "batch": {"min": 8, "max": 4096}}, "batch"),  # bounds without adaptive
        ({**SPEC, "batch": {"adaptive": True, "spread": 2}}, "batch.spread"),
    ]
    with live_api.client(live_api.alice) as alice:
        for payload, loc in cases:
            response = alice.post("/v1/jobs", json=payload)
            assert response.status_code == 422, (payload, response.text)
            error = response.json()["error"]
            assert loc in [d["loc"] for d in error["details"]], (loc, error)
            assert error["message"].startswith("invalid request")
            assert not any(d["message"].startswith("Value error") for d in error["details"])
        malformed = alice.post(
            "/v1/jobs", content=b'{"name": ', headers={"content-type": "application/json"}
        )
        assert malformed.status_code == 422
        detail = malformed.json()["error"]["details"][0]
        assert detail["loc"] == "body" and "not valid JSON" in detail["message"]
        assert alice.post("/v1/jobs").status_code == 422  # no body at all
        assert alice.get("/v1/jobs").json()["total"] == 0


def test_auth_is_required(live_api: LiveApi) -> None:
    with live_api.client(None) as anonymous:
        response = anonymous.get("/v1/jobs")
        assert response.status_code == 401
        assert "bearer" in response.json()["error"]["message"]
        assert response.headers["www-authenticate"] == "Bearer"
        assert anonymous.post("/v1/jobs", json=SPEC).status_code == 401
    with live_api.client("jsu_not-a-token") as forged:
        assert forged.get("/v1/jobs").status_code == 401
    with live_api.client(live_api.agent) as agent:
        assert agent.get("/v1/jobs").status_code == 403
        assert agent.post("/v1/jobs", json=SPEC).status_code == 403


def test_client_mistakes_never_500(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice:
        for path in (
            "/v1/jobs/99999999999999999999",
            "/v1/jobs/0",
            "/v1/jobs/-3",
            "/v1/jobs/abc",
            "/v1/jobs?limit=-1",
            "/v1/jobs?limit=100000",
            "/v1/jobs?after=99999999999999999999",
            "/v1/jobs/1/metrics?points=0",
            "/v1/nowhere",
        ):
            response = alice.get(path)
            assert 400 <= response.status_code < 500, (path, response.status_code)
            assert "error" in response.json()
        assert alice.get("/v1/jobs/9223372036854775807").status_code == 404


def test_metrics_series_is_downsampled(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice:
        job = _submit(alice)
        factory = session_factory(live_api.engine)
        with factory() as session, session.begin():
            # step_seconds alternates 1, 3: every even-width bucket averages to 2. The
            # job runs on 2 workers at a batch of 256 from iteration 5,000 (an elastic,
            # adaptive job's resize), 1 at 128 before.
            record(
                session,
                (
                    {
                        "job_id": job["id"],
                        "iteration": i,
                        "step_seconds": 1.0 + 2 * (i % 2),
                        "workers": 1 + (i >= 5_000),
                        "batch_size": 128 << (i >= 5_000),
                        "learning_rate": 0.1,
                    }
                    for i in range(10_000)
                ),
            )
        series = alice.get(f"/v1/jobs/{job['id']}/metrics", params={"points": 100}).json()
        points = series["points"]
        assert 0 < len(points) <= 100
        iterations = [p["iteration"] for p in points]
        assert iterations == sorted(iterations) and iterations[-1] == 9_999
        assert all(abs(p["step_seconds"] - 2.0) < 1e-9 for p in points)
        assert points[0]["loss"] is None
        assert [(p["workers"], p["batch_size"]) for p in (points[0], points[-1])] == [
            (1, 128),
            (2, 256),
        ]
        assert all(p["learning_rate"] == pytest.approx(0.1) for p in points)


def test_cluster_view_shows_holders_to_owner_only(live_api: LiveApi) -> None:
    with live_api.client(live_api.alice) as alice, live_api.client(live_api.bob) as bob:
        job = _submit(alice)
        factory = session_factory(live_api.engine)
        with factory() as session, session.begin():
            node = Node(name="node-a")
            session.add(node)
            session.flush()
            gpus = [
                GPU(node_id=node.id, index=i, kind="A100", memory_bytes=40 << 30) for i in (0, 1)
            ]
            session.add_all([*gpus, Agent(node_id=node.id, version="1")])
            session.flush()
            session.add(
                Allocation(job_id=job["id"], gpu_id=gpus[0].id, rank=0, lease_iterations=10)
            )
            # The holder's utilization is its newest report's.
            record(
                session,
                [
                    {"job_id": job["id"], "iteration": i, "step_seconds": 1.0, "utilization": u}
                    for i, u in ((2, 0.75), (1, 0.25))
                ],
            )
        view = alice.get("/v1/cluster").json()
        assert view["totals"]["gpus"] == 2 and view["totals"]["gpus_busy"] == 1
        assert view["totals"]["jobs_queued"] == 1
        holder = view["nodes"][0]["gpus"][0]["holders"][0]
        assert holder["job_id"] == job["id"] and holder["job_name"] == "digits"
        assert holder["utilization"] == 0.75
        hidden = bob.get("/v1/cluster").json()["nodes"][0]["gpus"][0]["holders"][0]
        assert hidden["job_id"] is None and hidden["job_name"] == ""


def test_probes_and_prometheus(live_api: LiveApi) -> None:
    with live_api.client(None) as anonymous, live_api.client(live_api.alice) as alice:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        assert anonymous.get("/readyz").status_code == 200
        job = _submit(alice)
        alice.get(f"/v1/jobs/{job['id']}")
        alice.get("/v1/jobs/123456")
        text = anonymous.get("/metrics").text
        assert 'route="/v1/jobs/{job_id}"' in text
        assert 'status_class="4xx"' in text and 'status_class="2xx"' in text
        assert "/v1/jobs/123456" not in text and f'/v1/jobs/{job["id"]}"' not in text
        assert 'jigsaw_jobs{state="QUEUED"} 1.0' in text
        assert anonymous.get("/docs").status_code == 200
        assert "/v1/jobs" in anonymous.get("/openapi.json").json()["paths"]


def test_unexpected_errors_are_json_500_and_logged(
    live_api: LiveApi, caplog: pytest.LogCaptureFixture
) -> None:
    with live_api.client(live_api.alice) as alice, live_api.client(None) as anonymous:
        job = _submit(alice)
        # A state outside the state machine can only come from a bug or manual SQL.
        with session_factory(live_api.engine)() as session, session.begin():
            session.execute(update(Job).where(Job.id == job["id"]).values(state="BOGUS"))
        with caplog.at_level(logging.ERROR, logger="api.errors"):
            response = alice.post(f"/v1/jobs/{job['id']}/cancel")
        assert response.status_code == 500
        assert response.json()["error"]["message"] == "internal error; see the server log"
        assert "Traceback" not in response.text and "BOGUS" not in response.text
        assert any("unhandled error" in r.getMessage() for r in caplog.records)
        metrics = anonymous.get("/metrics").text
        assert 'route="/v1/jobs/{job_id}/cancel",status_class="5xx"' in metrics


def test_readyz_is_503_when_schema_is_behind(live_api: LiveApi) -> None:
    with session_factory(live_api.engine)() as session, session.begin():
        session.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    with live_api.client(None) as anonymous:
        response = anonymous.get("/readyz")
        assert response.status_code == 503
        assert "not at head" in response.json()["error"]["message"]
        assert anonymous.get("/healthz").status_code == 200
