"""Trial code is not trusted: it must reach neither the control plane's nor an agent's
secrets, and a workload reference must not make the scheduler or an agent run a module.

The clusters here are real: `jigsaw up` and `jigsaw agent` processes, a user trial module
on PYTHONPATH that, at import, tries what the attacker of issue 19 did (read
`credentials.json`, `agent-token`, the database, its environment and the agent's) and
writes what it got where the test reads it. Running workers as another user needs root.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import api
from api.client import JigsawClient
from api.credentials import agent_token_path, load_credentials
from api.server import free_port
from scheduler.db import make_engine
from tests.cluster import ended, wait_for
from tests.conftest import LiveApi
from tests.servers import JIGSAW, clean_env, jigsaw_up_with
from worker_agent.gpus import virtual_slots
from worker_agent.isolation import IsolationError, worker_environment
from worker_agent.supervisor import Supervisor

BACKENDS = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="runs workers as another user: needs root")
NOBODY = pwd.getpwnam("nobody")
CANARIES = {"JIGSAW_API_TOKEN": "canary-api-token", "HF_TOKEN": "canary-hf-token"}
PROBE_MODULE = "jigsaw_isolation_probe"
# Module-level code: runs wherever the module is imported, and says where that was.
PROBE = '''
import json, os, sys
from pathlib import Path

from worker_agent.runtime.workloads.digits import DigitsMLP

HOME = Path({home!r})


def _attempt(read):
    try:
        return read()
    except OSError as exc:
        return "denied: " + type(exc).__name__


found = {{
    "argv": sys.argv,
    "uid": os.getuid(),
    "credentials": _attempt(lambda: (HOME / "credentials.json").read_text()),
    "agent_token": _attempt(lambda: (HOME / "agent-token").read_text()),
    "database": _attempt(lambda: (HOME / "jigsaw.db").read_bytes()[:64].hex()),
    "listing": _attempt(lambda: sorted(os.listdir(HOME))),
    "agent_log": _attempt(lambda: (HOME / "agents" / "local-0" / "agent.log").read_text()),
    "agent_environ": _attempt(
        lambda: Path(f"/proc/{{os.getppid()}}/environ").read_bytes().decode(errors="replace")
    ),
    "agent_cmdline": _attempt(
        lambda: Path(f"/proc/{{os.getppid()}}/cmdline").read_bytes().decode(errors="replace")
    ),
    "environ": dict(os.environ),
}}
(Path(__file__).parent / "found" / f"{{os.getpid()}}.json").write_text(json.dumps(found))


class ProbeTrial(DigitsMLP):
    """Trains like digits-mlp: the job must still succeed, checkpoints included."""


class NotATrial:
    pass
'''


@dataclass(frozen=True)
class Runtime:
    """How to run JigSaw so that the worker user can run the same Python."""

    jigsaw: list[str]
    pythonpath: str  # what the interpreter needs on PYTHONPATH for the project


@pytest.fixture(scope="session")
def runtime() -> Runtime:
    """This interpreter when the worker user can run it, else a system Python of the same
    version with this environment's packages on PYTHONPATH (a Python under a private
    /root, as here, is out of its reach: which is the point of running it as nobody)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    packages = f"{Path(api.__file__).parents[1]}{os.pathsep}{sysconfig.get_paths()['purelib']}"
    for python in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        try:
            probe = subprocess.run(
                [python, "-c", "import sys, torch, worker_agent.runtime.worker; "
                 f"sys.exit(sys.version_info[:2] != {sys.version_info[:2]})"],
                env={"PATH": os.environ["PATH"], "PYTHONPATH": packages},
                user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
                capture_output=True, timeout=120, check=False,
            )  # fmt: skip
        except OSError:
            continue
        if probe.returncode == 0:
            return Runtime([python, "-m", "api.cli"], packages)
    pytest.skip(f"no Python {version} with this environment's packages runs as nobody")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory another user can search (pytest's own temporary root is private)."""
    path = Path(tempfile.mkdtemp(prefix="jigsaw-isolation-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _database_env(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """PostgreSQL's URL, or nothing: the embedded SQLite file in JIGSAW_HOME."""
    if backend == "sqlite":
        return {}
    return {"JIGSAW_DATABASE_URL": str(request.getfixturevalue("postgres_url"))}


def _trials(root: Path, home: Path) -> Path:
    """The probe module in a directory every user can read, its findings beside it."""
    trials = root / "trials"
    (trials / "found").mkdir(parents=True)
    trials.chmod(0o755)
    (trials / "found").chmod(0o777)
    module = trials / f"{PROBE_MODULE}.py"
    module.write_text(PROBE.format(home=str(home)))
    module.chmod(0o644)
    return trials


def _findings(trials: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((trials / "found").glob("*.json"))]


def _probe_job(client: JigsawClient, attribute: str = "ProbeTrial") -> int:
    job_id: int = client.submit(
        {
            "name": f"probe-{attribute.lower()}",
            "workload": f"{PROBE_MODULE}:{attribute}",
            "hyperparameters": {"batch_size": 32},
            "max_iterations": 12,
        }
    )["id"]
    return job_id


def _wait(client: JigsawClient, job_id: int) -> dict[str, Any]:
    job: dict[str, Any] = {}

    def done() -> bool:
        nonlocal job
        job = client.get_job(job_id)
        return ended(job)

    wait_for(done, f"job {job_id} ended", seconds=240)
    return job


def _assert_no_secret(found: dict[str, Any], secrets: list[str]) -> None:
    """What the trial got holds none of the secrets, in any form."""
    assert found["credentials"].startswith("denied"), found["credentials"]
    assert found["agent_token"].startswith("denied"), found["agent_token"]
    assert found["agent_environ"].startswith("denied"), found["agent_environ"][:200]
    text = json.dumps(found)
    for secret in secrets:
        assert secret not in text, f"the trial read a secret: {secret[:8]}..."
    assert not [name for name in found["environ"] if name.startswith("JIGSAW_") and
                name not in ("JIGSAW_WORKER_AUTHKEY", "JIGSAW_WORKER_AGENT_PID")]  # fmt: skip


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@AS_ROOT
@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_trials_of_a_root_jigsaw_up_run_as_the_worker_user_and_reach_no_secret(
    backend: str, shared_tmp: Path, runtime: Runtime, request: pytest.FixtureRequest
) -> None:
    """The probe of issue 19: `jigsaw up --local-agents` as root, a trial reading tokens."""
    home = shared_tmp / "home"
    trials = _trials(shared_tmp, home)
    env = {
        **_database_env(backend, request),
        **CANARIES,
        "PYTHONPATH": f"{runtime.pythonpath}{os.pathsep}{trials}",
        "JIGSAW_AGENT_WORKER_USER": "nobody",
        "JIGSAW_SCHEDULER_CHECKPOINT_EVERY": "5",
    }
    with jigsaw_up_with(home, ["--local-agents", "1", "--gpus-per-agent", "1"], env,
                        log_dir=shared_tmp, jigsaw=runtime.jigsaw) as server:  # fmt: skip
        credentials = load_credentials(home)
        assert credentials is not None
        with JigsawClient(server.url, credentials.token) as client:
            probe = _wait(client, _probe_job(client))
            not_a_trial = _wait(client, _probe_job(client, "NotATrial"))
        secrets = [credentials.token, agent_token_path(home).read_text().strip()]
        log = server.log.read_text()

    # The trial trained (checkpoints written as the worker user) and found nothing.
    assert probe["state"] == "SUCCEEDED", probe["message"]
    findings = _findings(trials)
    assert len(findings) == 2, findings  # one import per job, each in a worker
    for found in findings:
        assert found["uid"] == NOBODY.pw_uid
        # `python -m worker_agent.runtime.worker`: a training process, nothing else.
        assert Path(found["argv"][0]).parts[-3:] == ("worker_agent", "runtime", "worker.py")
        _assert_no_secret(found, [*secrets, *CANARIES.values()])
        assert found["listing"].startswith("denied"), found["listing"]
        assert found["database"].startswith("denied"), found["database"]
        assert found["agent_log"].startswith("denied: PermissionError"), found["agent_log"]
    assert list((home / "checkpoints" / f"job-{probe['id']}").iterdir())
    # A reference to a class that is not a Trial fails the job with that reason alone.
    assert not_a_trial["state"] == "FAILED"
    assert "is not a subclass of worker_agent.runtime.trial.Trial" in not_a_trial["message"]
    assert "Traceback" not in not_a_trial["message"]
    # The home stays private, only searchable by the worker user on the way to its
    # directories; the secrets in it are their owner's alone.
    assert _mode(home) == 0o711
    assert _mode(home / "credentials.json") == _mode(agent_token_path(home)) == 0o600
    assert "Traceback" not in log


@AS_ROOT
@pytest.mark.parametrize("backend", ["sqlite"])
def test_trials_of_an_unprivileged_agent_reach_no_secret(
    backend: str, shared_tmp: Path, runtime: Runtime, request: pytest.FixtureRequest
) -> None:
    """An agent that is not root: its workers share its user, so file permissions, the
    scrubbed environment and the agent's non-dumpable memory are what protects."""
    home = shared_tmp / "home"
    trials = _trials(shared_tmp, home)
    checkpoints, work = shared_tmp / "checkpoints", shared_tmp / "agent"
    for directory in (checkpoints, work):
        directory.mkdir()
        os.chown(directory, NOBODY.pw_uid, NOBODY.pw_gid)
    grpc_port = free_port()
    server_env = {
        **_database_env(backend, request),
        "JIGSAW_GRPC_PORT": str(grpc_port),
        "JIGSAW_GRPC_CHECKPOINT_DIR": str(checkpoints),
        "PYTHONPATH": runtime.pythonpath,
    }
    with jigsaw_up_with(home, [], server_env, log_dir=shared_tmp, jigsaw=runtime.jigsaw) as server:
        credentials = load_credentials(home)
        assert credentials is not None
        wait_for(agent_token_path(home).exists, "the cluster token")  # once it leads
        cluster_token = agent_token_path(home).read_text().strip()
        agent_env = clean_env(
            home,
            **CANARIES,
            PYTHONPATH=f"{runtime.pythonpath}{os.pathsep}{trials}",
            # The token in the environment, not in a file the workers could read.
            JIGSAW_AGENT_TOKEN=cluster_token,
        )
        with (shared_tmp / "agent.log").open("wb") as log:
            agent = subprocess.Popen(
                [*runtime.jigsaw, "agent", "--scheduler", f"127.0.0.1:{grpc_port}", "--gpus", "1",
                 "--node-name", "unprivileged", "--work-dir", str(work)],
                env=agent_env, stdout=log, stderr=log,
                user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
            )  # fmt: skip
        try:
            with JigsawClient(server.url, credentials.token) as client:
                probe = _wait(client, _probe_job(client))
        finally:
            agent.terminate()
            agent.wait(timeout=60)

    agent_log = (shared_tmp / "agent.log").read_text()
    assert probe["state"] == "SUCCEEDED", (probe["message"], agent_log[-3000:])
    (found,) = _findings(trials)
    assert found["uid"] == NOBODY.pw_uid
    _assert_no_secret(found, [credentials.token, cluster_token, *CANARIES.values()])
    assert "Traceback" not in agent_log, agent_log[-3000:]


@pytest.mark.parametrize(
    "workload",
    ["this:Trial", "os:system", "subprocess:Popen", "api.server:serve",
     "mytrials:Net\n"],
)  # fmt: skip
def test_a_workload_that_is_no_user_module_is_refused_unimported(
    live_api: LiveApi, workload: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Refused at submission (422, naming the field), before anything is imported."""
    already = set(sys.modules)
    spec = {"name": "probe", "workload": workload, "max_iterations": 1}
    with live_api.client(live_api.alice) as client:
        response = client.post("/v1/jobs", json=spec)
        assert response.status_code == 422, response.text
        assert "workload" in response.text
        assert client.get("/v1/jobs").json()["items"] == []
    assert "Beautiful is better than ugly" not in capfd.readouterr().out
    top = workload.partition(".")[0].partition(":")[0]
    assert not [name for name in set(sys.modules) - already if name.split(".")[0] == top]


def test_the_worker_environment_is_an_allow_list() -> None:
    environ = {
        "PATH": "/usr/bin",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/opt/trials",
        "JIGSAW_AGENT_TOKEN": "secret",
        "JIGSAW_API_TOKEN": "secret",
        "JIGSAW_DATABASE_URL": "postgresql://jigsaw:secret@db/jigsaw",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "HF_TOKEN": "secret",
        "HF_HOME": "/cache/hf",
        "TORCH_AUTH_TOKEN": "secret",
        "SOMETHING_ELSE": "x",
    }
    assert worker_environment(environ) == {
        "PATH": "/usr/bin",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/opt/trials",
    }
    # An operator may add names, never a secret or a JIGSAW_* one.
    extra = worker_environment(environ, ["HF_*", "JIGSAW_*", "AWS_*"])
    assert extra["HF_HOME"] == "/cache/hf"
    assert "HF_TOKEN" not in extra and "AWS_SECRET_ACCESS_KEY" not in extra
    assert not [name for name in extra if name.startswith("JIGSAW_")]


@AS_ROOT
def test_a_root_agent_refuses_a_work_dir_the_worker_user_cannot_reach(tmp_path: Path) -> None:
    """pytest's temporary root is private: workers as nobody could not reach their files."""
    with pytest.raises(IsolationError, match=r"worker user nobody cannot reach .*may not search"):
        Supervisor(virtual_slots(1), tmp_path / "agent", worker_user="nobody")


@AS_ROOT
def test_a_root_jigsaw_up_refuses_local_agents_whose_workers_could_not_reach_their_files(
    tmp_path: Path,
) -> None:
    """Its home in pytest's private temporary root: said at once, before serving."""
    env = clean_env(tmp_path / "home", JIGSAW_AGENT_WORKER_USER="nobody")
    result = subprocess.run(
        [*JIGSAW, "up", "--port", "0", "--local-agents", "1"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "who cannot reach" in result.stderr and "may not search" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@BACKENDS
def test_jigsaw_up_creates_a_private_home(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    home = tmp_path / "new" / "home"
    with jigsaw_up_with(home, [], _database_env(backend, request), log_dir=tmp_path):
        # Written once this replica leads (the agents' endpoint), soon after it serves.
        wait_for(agent_token_path(home).exists, "the cluster token")
        modes = {path.name: _mode(path) for path in home.iterdir() if path.is_file()}
        assert _mode(home) == 0o700
    assert modes["credentials.json"] == modes["agent-token"] == 0o600
    if backend == "sqlite":
        database = {"jigsaw.db", "jigsaw.db-wal", "jigsaw.db-shm"}
        assert database <= set(modes), modes
        assert {modes[name] for name in database} == {0o600}


def test_an_older_sqlite_database_is_made_private(tmp_path: Path) -> None:
    """One written by an earlier version (0644), its WAL and shared memory included."""
    names = ("jigsaw.db", "jigsaw.db-wal", "jigsaw.db-shm")
    url = f"sqlite:///{tmp_path / names[0]}"
    engine = make_engine(url)
    with engine.connect() as connection:  # holds the WAL and shared-memory files open
        connection.exec_driver_sql("CREATE TABLE t (x)")
        for name in names:
            (tmp_path / name).chmod(0o644)
        make_engine(url).dispose()
        modes = {name: _mode(tmp_path / name) for name in names}
    engine.dispose()
    assert set(modes.values()) == {0o600}, modes
