"""SPB through the REST API: bad configurations refused at submission, model profiles
stored and read (real HTTP, SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

from tests.conftest import LiveApi

SPEC: dict[str, Any] = {"name": "cnn", "workload": "digits-cnn", "max_iterations": 50}
STAGE = {
    "forward_seconds": 0.001,
    "backward_input_seconds": 0.001,
    "backward_weight_seconds": 0.002,
    "activation_bytes": 4096,
    "parameter_bytes": 1024,
}


def test_bad_spb_configurations_are_refused_with_their_field(live_api: LiveApi) -> None:
    cases = [
        (
            {"full_fraction": 0.5, "partial_depth": 0},
            "spb.SPBConfig.partial_depth",
            "greater than 0",
        ),
        ({"full_fraction": 1.5, "partial_depth": 0.5}, "spb.SPBConfig.full_fraction", "less than"),
        ({"full_fraction": -0.1, "partial_depth": 0.5}, "spb.SPBConfig.full_fraction", "greater"),
        (
            {"full_fraction": 0.5, "partial_depth": 0.5, "stages": 4},
            "body",
            "more than the 3 layers with parameters of 'digits-cnn'",
        ),
        ({"full_fraction": 0.5}, "spb.SPBConfig.partial_depth", "required"),
        ("sometimes", "spb", ""),
    ]
    with live_api.client(live_api.alice) as alice:
        for spb, loc, words in cases:
            response = alice.post("/v1/jobs", json={**SPEC, "spb": spb})
            assert response.status_code == 422, (spb, response.text)
            details = response.json()["error"]["details"]
            assert any(d["loc"].startswith(loc) and words in d["message"] for d in details), (
                spb,
                details,
            )
        # A cut the model allows is accepted; nothing of the refused ones was stored.
        ok = alice.post(
            "/v1/jobs",
            json={**SPEC, "spb": {"full_fraction": 0.5, "partial_depth": 0.5, "stages": 3}},
        )
        assert ok.status_code == 201, ok.text
        assert alice.get("/v1/jobs").json()["total"] == 1


def test_profiles_are_stored_by_admins_and_read_by_everyone(live_api: LiveApi) -> None:
    profile = {"per_worker_batch": 16, "stages": [STAGE, STAGE], "steps_ratio": {"0.5/0.25": 1.2}}
    with live_api.client(live_api.alice) as alice, live_api.client(live_api.root) as root:
        assert alice.get("/v1/profiles").json() == {"items": []}
        assert alice.get("/v1/profiles/digits-cnn").status_code == 404
        assert alice.put("/v1/profiles/digits-cnn", json=profile).status_code == 403
        stored = root.put("/v1/profiles/digits-cnn", json=profile)
        assert stored.status_code == 200, stored.text
        assert stored.json()["key"] == "cpu/batch-16"
        # Saving again replaces: one profile per workload, batch and device kind.
        again = root.put("/v1/profiles/digits-cnn", json={**profile, "steps_ratio": {}})
        assert again.status_code == 200
        (item,) = alice.get("/v1/profiles/digits-cnn").json()["items"]
        assert item["profile"]["stages"] == [STAGE, STAGE]
        assert item["profile"]["steps_ratio"] == {}
        bad = [
            ("no such thing", profile),
            ("digits-cnn", {**profile, "stages": []}),
            ("digits-cnn", {**profile, "stages": [{**STAGE, "forward_seconds": -1}]}),
            ("digits-cnn", {**profile, "steps_ratio": {"0.5/0.25": 0}}),
            ("digits-cnn", {**profile, "surprise": 1}),
        ]
        for workload, body in bad:
            response = root.put(f"/v1/profiles/{workload}", json=body)
            assert response.status_code == 422, (workload, body, response.text)
        assert len(alice.get("/v1/profiles").json()["items"]) == 1
