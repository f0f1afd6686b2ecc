"""Uploading a job's code (POST /v1/code) and its retention, on SQLite and PostgreSQL
through the real app on loopback."""

from __future__ import annotations

import io
import os
import tarfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select, update

from jigsaw import codearchive
from scheduler.db import session_factory
from scheduler.dispatch import SimulatedDispatcher
from scheduler.loop import SchedulerService
from scheduler.orm import CodeArchive, Job, utcnow
from scheduler.settings import APISettings, SchedulerSettings
from tests.conftest import LiveApi

KIB = 1024
GZIP = {"content-type": "application/octet-stream"}
SPEC: dict[str, Any] = {"name": "mine", "workload": "my_pkg.trial:Mine", "max_iterations": 5}


def _code(tmp_path: Path, text: str = "WIDTH = 3\n") -> bytes:
    (tmp_path / "my_pkg").mkdir(parents=True, exist_ok=True)
    (tmp_path / "my_pkg" / "trial.py").write_text(text)
    return codearchive.pack(tmp_path, codearchive.Limits())


def _upload(client: httpx.Client, data: bytes) -> httpx.Response:
    return client.post("/v1/code", content=data, headers=GZIP)


def _stored(engine: Engine) -> set[str]:
    with session_factory(engine)() as session:
        return set(session.scalars(select(CodeArchive.digest)))


@pytest.mark.parametrize(
    "live_api_settings", [{"api": APISettings(max_body_bytes=4 * KIB, max_code_bytes=64 * KIB)}]
)
def test_code_is_stored_by_digest_and_over_its_limit_refused_with_413(
    live_api: LiveApi, tmp_path: Path
) -> None:
    data = _code(tmp_path, "WEIGHTS = " + repr(os.urandom(3 * KIB)) + "\n")
    assert 4 * KIB < len(data) < 64 * KIB  # more than any other route takes
    with live_api.client(live_api.alice) as alice:
        created = _upload(alice, data)
        assert created.status_code == 201, created.text
        digest = created.json()["digest"]
        assert digest == codearchive.digest_of(data) and created.json()["size"] == len(data)
        again = _upload(alice, data)
        assert (again.status_code, again.json()["digest"]) == (200, digest)
        assert _stored(live_api.engine) == {digest}

        job = alice.post("/v1/jobs", json={**SPEC, "code": digest})
        assert job.status_code == 201, job.text
        assert job.json()["spec"]["code"] == digest

        too_large = _upload(alice, os.urandom(64 * KIB + 1))
        assert too_large.status_code == 413
        assert "larger than 65536 bytes" in too_large.json()["error"]["message"]
        # Every other route keeps its own limit.
        padded = {**SPEC, "name": "x" * 100, "queue": "y" * 5 * KIB}
        assert alice.post("/v1/jobs", json=padded).status_code == 413
    # Only users upload code, and nobody anonymously.
    with live_api.client(None) as anonymous:
        assert _upload(anonymous, data).status_code == 401
    with live_api.client(live_api.agent) as agent:
        assert _upload(agent, data).status_code == 403
    assert _stored(live_api.engine) == {digest}


def _escaping_archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("my_pkg/../../../etc/cron.d/evil")
        payload = b"* * * * * root rm -rf /\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def test_a_path_traversal_archive_and_an_unknown_digest_are_refused_with_reasons(
    live_api: LiveApi,
) -> None:
    with live_api.client(live_api.alice) as alice:
        escaping = _upload(alice, _escaping_archive())
        assert escaping.status_code == 422, escaping.text
        error = escaping.json()["error"]
        assert "leaves the archive's directory" in error["message"]
        assert [detail["loc"] for detail in error["details"]] == ["body"]
        junk = _upload(alice, b"#!/bin/sh\nrm -rf /\n")
        assert junk.status_code == 422 and "not a gzipped tar" in junk.text

        unknown = "sha256:" + "0" * 64
        missing = alice.post("/v1/jobs", json={**SPEC, "code": unknown})
        assert missing.status_code == 422
        assert missing.json()["error"]["details"][0]["loc"] == "code"
        assert "upload it first" in missing.text
        not_a_digest = alice.post("/v1/jobs", json={**SPEC, "code": "../../etc/passwd"})
        assert not_a_digest.status_code == 422
        assert not_a_digest.json()["error"]["details"][0]["loc"] == "code"
    assert _stored(live_api.engine) == set()


def test_code_is_deleted_with_the_retention_of_the_jobs_that_name_it(
    live_api: LiveApi, tmp_path: Path
) -> None:
    retention = 3600.0
    with live_api.client(live_api.alice) as alice:
        kept_by_job = _upload(alice, _code(tmp_path / "a")).json()["digest"]
        unused = _upload(alice, _code(tmp_path / "b", "WIDTH = 4\n")).json()["digest"]
        job_id = alice.post("/v1/jobs", json={**SPEC, "code": kept_by_job}).json()["id"]
    factory = session_factory(live_api.engine)
    service = SchedulerService(
        factory, SimulatedDispatcher(10), SchedulerSettings(code_retention_seconds=retention)
    )
    now = utcnow()
    # Within the retention both stay.
    assert service.expire_code(now) == 0
    # Past it, the code no job names goes; the queued job's stays, however old.
    later = now + timedelta(seconds=retention + 60)
    assert service.expire_code(later) == 1
    assert _stored(live_api.engine) == {kept_by_job}
    # Once the job has ended, its code stays for the retention, then goes.
    with factory() as session, session.begin():
        session.execute(
            update(Job).where(Job.id == job_id).values(state="SUCCEEDED", finished_at=later)
        )
    assert service.expire_code(later + timedelta(seconds=retention - 60)) == 0
    assert service.expire_code(later + timedelta(seconds=retention + 60)) == 1
    assert _stored(live_api.engine) == set()
    assert unused not in _stored(live_api.engine)


def test_only_who_uploaded_an_archive_may_run_it(live_api: LiveApi, tmp_path: Path) -> None:
    data = _code(tmp_path)
    with live_api.client(live_api.alice) as alice:
        digest = _upload(alice, data).json()["digest"]
    unknown = "sha256:" + "0" * 64
    with live_api.client(live_api.bob) as bob, live_api.client(live_api.root) as root:
        # Knowing alice's digest is not enough, for a user or an admin; the refusal is
        # the one an unknown digest gets, so it tells nobody what code others run.
        for client in (bob, root):
            stolen = client.post("/v1/jobs", json={**SPEC, "code": digest})
            assert stolen.status_code == 422, stolen.text
            assert stolen.json()["error"]["details"][0]["loc"] == "code"
            guessed = client.post("/v1/jobs", json={**SPEC, "code": unknown}).json()
            assert (
                stolen.json()["error"]["message"].replace(digest, unknown)
                == (guessed["error"]["message"])
            )
        # Uploading the same code makes it bob's too: new to him (201, not 200).
        assert _upload(bob, data).status_code == 201
        assert bob.post("/v1/jobs", json={**SPEC, "code": digest}).status_code == 201
    assert _stored(live_api.engine) == {digest}
