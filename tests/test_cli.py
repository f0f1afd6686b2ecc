"""The `jigsaw` CLI end to end: a real `jigsaw up` subprocess (embedded SQLite under a
temporary JIGSAW_HOME), and CLI commands run as subprocesses that find it through the
credentials file. Plus the client's error handling and retries, without a server.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from api.cli import load_spec_file, sparkline, validate_spec
from api.client import ApiError, JigsawClient
from api.credentials import Credentials, load_credentials, resolve, save_credentials
from api.server import free_port
from jigsaw import codearchive
from scheduler.db import make_engine, session_factory, transaction
from scheduler.models.metrics import record
from scheduler.orm import Job
from scheduler.settings import APISettings, Settings
from tests.servers import (
    HTTP_TIMEOUT_SECONDS,
    JIGSAW,
    TERMINAL,
    Server,
    clean_env,
    jigsaw_up,
)


def cli(
    home: Path, *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*JIGSAW, *args],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert result.returncode == 0, (
            f"jigsaw {' '.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def cli_json(home: Path, *args: str) -> Any:
    return json.loads(cli(home, *args, "--json").stdout)


def wait_for_state(server: Server, job_id: int, states: set[str], timeout: float = 30) -> dict:
    headers = {"Authorization": f"Bearer {server.token()}"}
    deadline = time.monotonic() + timeout
    while True:
        job = httpx.get(f"{server.url}/v1/jobs/{job_id}", headers=headers, timeout=5).json()
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}"
        time.sleep(0.1)


def write_spec(path: Path, **overrides: Any) -> Path:
    fields = {
        "name": "digits-1",
        "workload": "digits-mlp",
        "hyperparameters": "{batch_size: 128, learning_rate: 0.05, optimizer: sgd}",
        "workers": 2,
        "max_iterations": 40,
        "spb": "off",  # a YAML 1.1 boolean; the CLI must read it as the string "off"
    }
    fields.update(overrides)
    path.write_text("".join(f"{key}: {value}\n" for key, value in fields.items()))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("jigsaw-home")
    # Oversized jobs are queued (not refused), so that one can show why it waits.
    with jigsaw_up(
        home, "--simulated-nodes", "2", "--gpus-per-node", "4", "--sim-speed", "200",
        JIGSAW_API_REFUSE_UNPLACEABLE="false",
    ) as s:  # fmt: skip
        yield s


# -- against a running server ---------------------------------------------------------


def test_submit_list_show_and_run_to_success(server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.yaml", name="e2e-success")
    job = cli_json(server.home, "submit", str(spec))
    job_id = job["id"]
    assert job["name"] == "e2e-success"
    assert job["owner"] == "admin"
    assert job["spec"]["spb"] == "off"

    listed = cli_json(server.home, "jobs")
    assert job_id in [item["id"] for item in listed["items"]]
    assert listed["total"] >= 1

    shown = cli_json(server.home, "job", str(job_id))
    assert shown["job"]["id"] == job_id
    assert shown["events"][0]["to_state"] == "QUEUED"

    # FIFO + the simulated dispatcher carry it through RUNNING to SUCCEEDED.
    done = wait_for_state(server, job_id, TERMINAL)
    assert done["state"] == "SUCCEEDED", done
    assert done["iterations_done"] == 40
    shown = cli_json(server.home, "job", str(job_id))
    reached = [event["to_state"] for event in shown["events"] if event["to_state"]]
    assert reached == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"]

    # People get tables.
    table = cli(server.home, "jobs", "--state", "succeeded").stdout
    assert "e2e-success" in table and "SUCCEEDED" in table
    assert "e2e-success" in cli(server.home, "job", str(job_id)).stdout
    filtered = cli_json(server.home, "jobs", "--state", "QUEUED", "--state", "RUNNING")
    assert job_id not in [item["id"] for item in filtered["items"]]


def test_job_shows_its_latest_metrics_and_a_loss_sparkline(server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.yaml", name="e2e-metrics")
    job_id = cli_json(server.home, "submit", str(spec))["id"]
    assert wait_for_state(server, job_id, TERMINAL)["state"] == "SUCCEEDED"
    assert "no metrics reported yet" in cli(server.home, "job", str(job_id)).stdout
    # What an agent's reports leave in the database (simulated nodes report none).
    engine = make_engine(Settings(home=server.home).database_url)
    try:
        with transaction(session_factory(engine)) as session:
            record(
                session,
                (
                    {
                        "job_id": job_id,
                        "iteration": i,
                        "loss": 2.0 / i,
                        "step_seconds": 0.25,
                        "workers": 2,
                        "batch_size": 1024,
                        "learning_rate": 0.0125,
                    }
                    for i in range(1, 41)
                ),
            )
            # As an adaptive batch's would be: 30 steps worth 40 of its base batch.
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(metrics={"accuracy": 0.93}, iterations_done=30, progress=40.6)
            )
    finally:
        engine.dispose()
    shown = cli(server.home, "job", str(job_id)).stdout
    assert "40/40 (100%) in 30 iterations" in shown
    assert "evaluation" in shown and "accuracy 0.93" in shown
    assert "iteration 40, loss 0.05, step 0.250 s" in shown
    assert "workers 2, batch 1,024, lr 0.0125" in " ".join(shown.split())  # it may wrap
    (loss,) = [line for line in shown.splitlines() if line.startswith("loss")]
    bars = sparkline([2.0 / i for i in range(1, 41)])
    assert bars.startswith("█▄▃") and bars.endswith("▁") and len(bars) == 40
    assert loss.split()[1:] == ["2", bars, "0.05"]


def test_cancel(server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "long.yaml", name="e2e-cancel", max_iterations=10**9)
    job_id = cli_json(server.home, "submit", str(spec))["id"]
    wait_for_state(server, job_id, {"RUNNING"})
    assert cli_json(server.home, "cancel", str(job_id))["state"] == "CANCELLED"

    # Cancelling again is refused by the API: one red line, exit 1, no traceback.
    again = cli(server.home, "cancel", str(job_id), check=False)
    assert again.returncode == 1
    assert again.stderr.startswith("error:") and "Traceback" not in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    # The next round frees its GPUs.
    deadline = time.monotonic() + 15
    while True:
        view = cli_json(server.home, "cluster")
        held = [h["job_id"] for n in view["nodes"] for g in n["gpus"] for h in g["holders"]]
        if job_id not in held:
            break
        assert time.monotonic() < deadline, "cancelled job still holds GPUs"
        time.sleep(0.2)


def test_a_job_no_capacity_can_hold_shows_why(server: Server, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "big.yaml", name="e2e-big", workers=16)
    job_id = cli_json(server.home, "submit", str(spec))["id"]
    reason = "needs 16 GPUs; the largest gang this cluster can form is 8"
    deadline = time.monotonic() + 30
    while cli_json(server.home, "job", str(job_id))["job"]["pending_reason"] != reason:
        assert time.monotonic() < deadline, "no pending reason"
        time.sleep(0.2)
    shown = " ".join(cli(server.home, "job", str(job_id)).stdout.split())
    assert f"waiting {reason} (#" in shown and " in queue default, #" in shown  # its place
    assert "pending" in shown  # its event
    listed = " ".join(cli(server.home, "jobs").stdout.split())
    assert f"job {job_id} waits: {reason} (#" in listed
    assert cli_json(server.home, "cancel", str(job_id))["state"] == "CANCELLED"


def test_cluster(server: Server) -> None:
    view = cli_json(server.home, "cluster")
    assert [node["name"] for node in view["nodes"]] == ["virtual-0", "virtual-1"]
    for node in view["nodes"]:
        assert node["alive"]
        assert [gpu["index"] for gpu in node["gpus"]] == [0, 1, 2, 3]
        assert all(gpu["virtual"] and gpu["kind"] == "virtual-cpu" for gpu in node["gpus"])
    assert view["totals"]["gpus"] == 8
    table = cli(server.home, "cluster").stdout
    assert "virtual-0" in table and "virtual-1" in table and "GPUs: 8 total" in table


def test_missing_job_is_a_clean_error(server: Server) -> None:
    result = cli(server.home, "job", "999999", check=False)
    assert result.returncode == 1
    assert "404" in result.stderr and "Traceback" not in result.stderr


def test_token_create_user(server: Server) -> None:
    result = cli(server.home, "token", "create", "--user", "carol")
    token = result.stdout.strip()
    assert result.stdout == token + "\n" and token.startswith("jsu_")
    response = httpx.get(
        f"{server.url}/v1/whoami",
        headers={"Authorization": f"Bearer {token}"},
        timeout=HTTP_TIMEOUT_SECONDS,
    )
    assert response.status_code == 200
    assert "carol" in response.text
    # Through the CLI too; carol sees none of admin's jobs.
    assert "carol" in cli(server.home, "--token", token, "whoami", "--json").stdout
    assert cli_json(server.home, "--token", token, "jobs")["total"] == 0


def test_agent_token_cannot_use_user_api(server: Server) -> None:
    token = cli(server.home, "token", "create", "--agent").stdout.strip()
    assert token.startswith("jsa_")
    result = cli(server.home, "--token", token, "jobs", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_bad_token_is_a_clean_error(server: Server) -> None:
    result = cli(server.home, "--token", "jsu_not-a-token", "jobs", check=False)
    assert result.returncode == 1
    assert "401" in result.stderr and "Traceback" not in result.stderr


def test_token_create_with_expiry_list_and_revoke(server: Server) -> None:
    token = cli(server.home, "token", "create", "--user", "erin", "--expires-in", "30d").stdout
    token = token.strip()
    listed = {t["user"]: t for t in cli_json(server.home, "token", "list")["items"]}
    erin = listed["erin"]
    assert erin["prefix"] == token[: len(erin["prefix"])] and erin["kind"] == "user"
    expires = datetime.fromisoformat(erin["expires_at"])
    assert timedelta(days=29) < expires - datetime.now(UTC) <= timedelta(days=30)
    table = cli(server.home, "token", "list").stdout
    for column in ("PREFIX", "KIND", "USER", "CREATED", "LAST USED", "EXPIRES", erin["prefix"]):
        assert column in table
    assert token not in table
    # erin sees only her own tokens
    assert [
        t["user"] for t in cli_json(server.home, "--token", token, "token", "list")["items"]
    ] == ["erin"]
    revoked = cli(server.home, "token", "revoke", erin["prefix"]).stdout
    assert f"revoked token {erin['prefix']} of erin" in revoked
    refused = cli(server.home, "--token", token, "whoami", check=False)
    assert refused.returncode == 1 and "401" in refused.stderr
    again = cli(server.home, "token", "revoke", erin["prefix"], check=False)
    assert again.returncode == 1 and "404" in again.stderr
    bad = cli(server.home, "token", "create", "--user", "erin", "--expires-in", "3x", check=False)
    assert bad.returncode == 2 and "--expires-in" in bad.stderr


def test_node_drain_shows_in_cluster_and_remove_is_refused_while_served(server: Server) -> None:
    try:
        assert "drained" in cli(server.home, "node", "drain", "virtual-1").stdout
        view = {n["name"]: n for n in cli_json(server.home, "cluster")["nodes"]}
        assert view["virtual-1"]["drained_at"] and not view["virtual-0"]["drained_at"]
        assert "drained" in cli(server.home, "cluster").stdout
        busy = cli(server.home, "node", "remove", "virtual-1", check=False)
        assert busy.returncode == 1 and "409" in busy.stderr and "alive" in busy.stderr
        missing = cli(server.home, "node", "drain", "nowhere", check=False)
        assert missing.returncode == 1 and "404" in missing.stderr
    finally:
        cli(server.home, "node", "undrain", "virtual-1")
    view = {n["name"]: n for n in cli_json(server.home, "cluster")["nodes"]}
    assert view["virtual-1"]["drained_at"] is None


def test_queue_create_list_show_edit_delete(server: Server, tmp_path: Path) -> None:
    created = cli_json(
        server.home, "queue", "create", "team-q", "--quota", "2", "--borrowing-limit", "1",
        "--users", "admin,alice",
    )  # fmt: skip
    assert (created["quota"], created["borrowing_limit"], created["users"]) == (
        2,
        1,
        ["admin", "alice"],
    )
    assert "team-q" in [q["name"] for q in cli_json(server.home, "queue", "list")["items"]]
    listed = " ".join(cli(server.home, "queue", "list").stdout.split())
    assert "team-q - 2 1 1.0" in listed
    edited = cli_json(server.home, "queue", "edit", "team-q", "--borrowing-limit", "none")
    assert edited["borrowing_limit"] is None and edited["quota"] == 2
    shown = " ".join(cli(server.home, "queue", "show", "team-q").stdout.split())
    assert "quota 2 GPU(s)" in shown and "users admin, alice" in shown

    spec = write_spec(tmp_path / "q.yaml", name="e2e-queue", workers=1, queue="team-q")
    job_id = cli_json(server.home, "submit", str(spec))["id"]
    assert wait_for_state(server, job_id, {"SUCCEEDED"})["queue"] == "team-q"
    assert "deleted" in cli(server.home, "queue", "delete", "team-q").stdout

    refused = cli(server.home, "submit", str(spec), check=False)
    assert refused.returncode == 1 and "queue" in refused.stderr and "422" in refused.stderr
    default = cli(server.home, "queue", "delete", "default", check=False)
    assert default.returncode == 1 and "409" in default.stderr
    bad = cli(server.home, "queue", "create", "x", "--quota", "many", check=False)
    assert bad.returncode == 2 and "--quota" in bad.stderr


# -- no server needed -----------------------------------------------------------------


def test_submit_code_ships_a_directory_and_refuses_what_cannot_be_shipped(
    server: Server, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path / "job.yaml", name="shipped", workload="my_pkg.trial:Mine")
    project = tmp_path / "project"
    (project / "my_pkg").mkdir(parents=True)
    (project / "my_pkg" / "trial.py").write_text("WIDTH = 3\n")
    job = cli_json(server.home, "submit", str(spec), "--code", str(project))
    assert job["spec"]["code"] == codearchive.digest_of(
        codearchive.pack(project, codearchive.Limits())
    )

    missing = cli(
        server.home, "submit", str(spec), "--code", str(tmp_path / "nowhere"), check=False
    )
    assert missing.returncode == 2 and "is not a directory" in missing.stderr
    (project / "passwords").symlink_to("/etc/passwd")
    linked = cli(server.home, "submit", str(spec), "--code", str(project), check=False)
    assert linked.returncode == 2 and "is a symbolic link" in linked.stderr
    (project / "passwords").unlink()
    (project / "json.py").write_text("")
    shadowing = cli(server.home, "submit", str(spec), "--code", str(project), check=False)
    assert shadowing.returncode != 0 and "stand in for module 'json'" in shadowing.stderr
    for result in (missing, linked, shadowing):
        assert "Traceback" not in result.stderr


def test_bad_spec_exits_2_with_field_paths(tmp_path: Path) -> None:
    bad = write_spec(
        tmp_path / "bad.yaml",
        workers=0,
        hyperparameters="{optimizer: adamw}",
        colour="blue",
    )
    result = cli(tmp_path, "submit", str(bad), check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "workers:" in result.stderr
    assert "hyperparameters.optimizer:" in result.stderr
    assert "colour: unknown field" in result.stderr

    no_rule = tmp_path / "no-rule.json"
    no_rule.write_text(json.dumps({"name": "x", "workload": "digits-mlp"}))
    result = cli(tmp_path, "submit", str(no_rule), check=False)
    assert result.returncode == 2 and "max_iterations" in result.stderr

    missing = cli(tmp_path, "submit", str(tmp_path / "nope.yaml"), check=False)
    assert missing.returncode == 2 and "no such file" in missing.stderr

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    result = cli(tmp_path, "submit", str(broken), check=False)
    assert result.returncode == 2 and "not valid YAML" in result.stderr
    assert "Traceback" not in result.stderr


def test_spec_files_are_read_strictly(tmp_path: Path) -> None:
    """Duplicate keys, deep nesting and coerced types exit 2 naming the problem; YAML
    1.2 numbers such as 1e-3 are numbers."""
    duplicated_yaml = tmp_path / "dup.yaml"
    duplicated_yaml.write_text("name: a\nworkload: digits-mlp\nmax_iterations: 5\nname: b\n")
    duplicated_json = tmp_path / "dup.json"
    duplicated_json.write_text(
        '{"name": "a", "workload": "digits-mlp", "max_iterations": 5,'
        ' "hyperparameters": {"batch_size": 8, "batch_size": 16}}'
    )
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("name: " + "[" * 50_000 + "]" * 50_000 + "\n")
    deep_json = tmp_path / "deep.json"
    deep_json.write_text('{"name": ' + "[" * 50_000 + "]" * 50_000 + "}")
    quoted = write_spec(tmp_path / "quoted.yaml", workers='"2"')
    boolean = write_spec(tmp_path / "bool.yaml", workers="true")
    newline = tmp_path / "newline.json"
    newline.write_text(json.dumps({"name": "job\n", "workload": "a:B\n", "max_iterations": 5}))
    metric = write_spec(tmp_path / "metric.yaml", target_metric="{name: perplexity, value: 2}")
    for spec, needles in (
        (duplicated_yaml, ["duplicate key 'name'", "line 4"]),
        (duplicated_json, ["hyperparameters.batch_size: duplicate key 'batch_size'"]),
        (deep_yaml, ["nested deeper than"]),
        (deep_json, ["nested deeper than"]),
        (quoted, ["workers: Input should be a valid integer"]),
        (boolean, ["workers: Input should be a valid integer"]),
        (newline, ["name: must start with", "workload: unknown workload"]),
        (metric, ["target_metric: workload 'digits-mlp' reports no metric 'perplexity'"]),
    ):
        result = cli(tmp_path, "submit", str(spec), check=False)
        assert result.returncode == 2, (spec.name, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr[-2000:]
        for needle in needles:
            assert needle in " ".join(result.stderr.split()), (spec.name, result.stderr)

    numbers = write_spec(
        tmp_path / "numbers.yaml",
        hyperparameters="{batch_size: 64, learning_rate: 1e-3}",
        target_metric="{name: accuracy, value: 1}",
    )
    spec = validate_spec(numbers, load_spec_file(numbers))
    assert spec.hyperparameters.learning_rate == 0.001 and spec.target_metric is not None


def test_unreachable_api_is_a_clean_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = cli(tmp_path, "--url", url, "--token", "jsu_x", "jobs", check=False)
    assert result.returncode == 1
    assert "cannot reach the JigSaw API" in result.stderr and url in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_no_token_is_a_clean_error(tmp_path: Path) -> None:
    result = cli(tmp_path, "jobs", check=False)
    assert result.returncode == 1 and "no API token" in result.stderr


def test_db_commands(tmp_path: Path) -> None:
    assert "behind" in cli(tmp_path, "db", "current").stdout
    cli(tmp_path, "db", "upgrade")
    assert "up to date" in cli(tmp_path, "db", "current").stdout
    cli(tmp_path, "db", "downgrade", "base")
    assert "base" in cli(tmp_path, "db", "current").stdout
    refused = cli(tmp_path, "token", "create", "--user", "dave", check=False)
    assert refused.returncode == 1 and "jigsaw db upgrade" in refused.stderr
    usage = cli(tmp_path, "token", "create", "--agent", "--user", "dave", check=False)
    assert usage.returncode == 2


def test_credentials_file_is_private_and_reused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with jigsaw_up(home) as first:
        path = home / "credentials.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        stored = json.loads(path.read_text())
        assert stored["user"] == "admin" and stored["url"] == first.url
        token = stored["token"]
        assert cli_json(home, "whoami")  # the CLI finds URL and token in the file
    with jigsaw_up(home, "--no-scheduler") as second:
        again = load_credentials(home)
        assert again is not None and again.token == token
        assert again.url == second.url  # the URL follows the latest server
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        response = httpx.get(
            f"{second.url}/v1/whoami",
            headers={"Authorization": f"Bearer {token}"},
            timeout=HTTP_TIMEOUT_SECONDS,
        )
        assert response.status_code == 200


# -- units ----------------------------------------------------------------------------


def test_resolve_prefers_settings_over_file(tmp_path: Path) -> None:
    save_credentials(tmp_path, Credentials("http://file:1", "tok-file", "admin"))
    settings = Settings(home=tmp_path, api=APISettings(url=None, token=None))
    assert resolve(settings) == Credentials("http://file:1", "tok-file", "admin")
    settings = Settings(home=tmp_path, api=APISettings(url="http://env:2/", token="tok-env"))
    assert resolve(settings) == Credentials("http://env:2", "tok-env", "")
    assert resolve(settings, url="http://flag:3", token="tok-flag").url == "http://flag:3"
    empty = Settings(home=tmp_path / "none", api=APISettings(host="0.0.0.0", port=9000))
    assert resolve(empty) == Credentials("http://127.0.0.1:9000", "", "")


def test_client_errors_and_retries() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) <= 2:
            raise httpx.ConnectError("refused", request=request)
        if request.method == "POST":
            body = {
                "error": {
                    "status": 422,
                    "message": "invalid job spec",
                    "details": [{"loc": ["body", "workers"], "message": "must be >= 1"}],
                }
            }
            return httpx.Response(422, json=body)
        return httpx.Response(200, json={"items": [], "total": 0, "next_after": None})

    with JigsawClient("http://x", "t", transport=httpx.MockTransport(handler)) as client:
        # GETs are retried on connection errors...
        assert client.list_jobs(states=["QUEUED"]) == {"items": [], "total": 0, "next_after": None}
        assert calls == ["GET", "GET", "GET"]
        with pytest.raises(ApiError) as info:
            client.submit({"name": "x"})
    assert info.value.status == 422
    assert info.value.details == [{"loc": ["body", "workers"], "message": "must be >= 1"}]
    assert str(info.value) == "invalid job spec: body.workers: must be >= 1 (HTTP 422)"

    posts: list[str] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        posts.append(request.method)
        raise httpx.ConnectError("refused", request=request)

    with (
        JigsawClient("http://x", "t", transport=httpx.MockTransport(refuse)) as client,
        pytest.raises(ApiError, match="cannot reach the JigSaw API at http://x"),
    ):
        client.cancel(1)
    assert posts == ["POST"]  # ...POSTs never are

    text = httpx.Response(502, text="bad gateway")
    assert str(ApiError.from_response(text)) == "bad gateway (HTTP 502)"


@pytest.mark.timeout(540)
def test_demo_trains_every_job_to_success_on_two_real_agents(tmp_path: Path) -> None:
    """The README's demo command, as a user runs it (minus the install)."""
    pytest.importorskip("torch")  # the train extra (not in the control-plane subset)
    # A hang guard, not a speed bound: on a CI machine under load the demo took over 120 s.
    demo_args = ("demo", "--home", str(tmp_path / "demo"), "--no-compare")
    result = cli(tmp_path, *demo_args, check=False, timeout=480)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout[result.stdout.rindex("summary") :]
    for name in ("digits-mlp", "lm-2-agents", "digits-cnn", "digits-cnn-spb"):
        assert name in summary
    assert summary.count("SUCCEEDED") == 4
    # What the scheduler (JigSaw, the default) did: every job was leased at least once.
    decided = summary[summary.index("what jigsaw decided") :]
    leases = re.search(r"\blease\b\W+(\d+)", decided)
    assert leases is not None and int(leases.group(1)) >= 4, decided
    assert "API on http://127.0.0.1:" in result.stdout
    server_log = (tmp_path / "demo" / "server.log").read_text()
    assert "Traceback" not in server_log, server_log[-3000:]


def test_profile_measures_stores_and_refuses_bad_input(server: Server, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the train extra (not in the control-plane subset)
    result = cli(
        server.home,
        "profile",
        "digits-cnn",
        "--workers",
        "2",
        "--batch-size",
        "32",
        "--repeats",
        "1",
        "--save",
        "--json",
    )
    profile = json.loads(result.stdout)
    assert profile["per_worker_batch"] == 16 and len(profile["stages"]) == 2
    assert all(stage["parameter_bytes"] > 0 for stage in profile["stages"])
    (stored,) = json.loads(cli(server.home, "profiles", "--json").stdout)["items"]
    assert stored["workload"] == "digits-cnn" and stored["profile"]["stages"] == profile["stages"]
    # Measured where an agent here runs jobs (no CUDA: its CPU slots), with how busy it
    # was and the memory it took.
    assert profile["device_kind"] == "virtual-cpu" and stored["key"] == "virtual-cpu/batch-16"
    assert profile["utilization"] > 0 and stored["profile"]["utilization"] == profile["utilization"]
    assert profile["peak_memory_bytes"] > 0
    assert stored["profile"]["peak_memory_bytes"] == profile["peak_memory_bytes"]
    # Its one phase on stderr, as a line (not a terminal), beside the JSON.
    assert "[1/1] digits-cnn: per-stage costs" in result.stderr
    for args, words in [
        (["no-such-workload"], "unknown workload"),
        (["digits-cnn", "--stages", "9"], "only 3 layers"),
        (["digits-cnn", "--workers", "8", "--batch-size", "4"], "smaller than --workers"),
        (["digits-cnn", "--efficiency", "--target", "accuracy=0.9"], "NAME>=VALUE"),
        (["digits-cnn", "--device", "gpu"], "write auto, cpu, cuda or cuda:N"),
    ]:
        refused = cli(tmp_path, "profile", *args, check=False)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_profile_efficiency_shows_each_phase_on_stderr_and_keeps_json_clean(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    args = ["digits-cnn", "--workers", "2", "--batch-size", "32", "--repeats", "1"]
    args += ["--efficiency", "--target", "accuracy>=0", "--max-iterations", "10", "--json"]
    result = cli(tmp_path, "profile", *args, timeout=840)
    # Every configuration reached the (trivial) target, so each has its price.
    profile = json.loads(result.stdout)
    assert set(profile["steps_ratio"]) == {"0.75/0.5", "0.5/0.25", "0.25/0.25"}
    # Off a terminal: one plain line as each phase begins, in order, no escape codes.
    phases = [line.split(" (")[0] for line in result.stderr.splitlines() if line.startswith("[")]
    assert phases == [
        "[1/5] digits-cnn: per-stage costs",
        "[2/5] digits-cnn: training to accuracy, full backprop",
        "[3/5] digits-cnn: training to accuracy, spb 0.75/0.5",
        "[4/5] digits-cnn: training to accuracy, spb 0.5/0.25",
        "[5/5] digits-cnn: training to accuracy, spb 0.25/0.25",
    ]
    assert "\x1b[" not in result.stderr
