"""The agent's own version string and its start-up diagnosis, with and without torch.

No torch import here: these run in the control-plane subset too (Python 3.12 and 3.13
without torch), where the diagnosis must say that torch is missing rather than crash.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import jigsaw
from worker_agent.diagnosis import checkpoint_root, diagnose
from worker_agent.gpus import discover, probe_cuda
from worker_agent.settings import AgentSettings

REPO = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter from the source tree; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_distribution_takes_its_version_from_the_package() -> None:
    assert importlib.metadata.version("jigsaw") == jigsaw.__version__


def test_the_agent_starts_without_package_metadata() -> None:
    # A checkout put on the path by hand has no installed metadata: the agent must import.
    printed = _python(
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "def version(name):\n"
        "    if name == 'jigsaw':\n"
        "        raise m.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "m.version = version\n"
        "from worker_agent.agent import AGENT_VERSION\n"
        "print(AGENT_VERSION)\n"
    )
    assert printed.strip() == jigsaw.__version__


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AgentSettings:
    monkeypatch.setenv("JIGSAW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("JIGSAW_GRPC_CHECKPOINT_DIR", raising=False)
    return AgentSettings(token="t", node_name="node-a", work_dir=tmp_path / "work", gpus="auto")


def test_the_diagnosis_says_what_this_node_has(settings: AgentSettings, tmp_path: Path) -> None:
    probe = probe_cuda()
    lines = diagnose(settings, discover("auto", probe), probe)
    assert lines[0].startswith(f"jigsaw agent {jigsaw.__version__} on node node-a, Python 3.")
    if importlib.util.find_spec("torch") is None:
        assert lines[4].startswith("torch: cannot be imported")
    else:
        assert lines[4] == f"torch: {probe.torch_version}"
        assert probe.torch_version is not None
        installed = importlib.metadata.version("torch")
        assert probe.torch_version.split("+")[0] == installed.split("+")[0]
    if not probe.devices:  # this machine: no GPU
        assert lines[1].startswith("GPUs: none found (")
        assert "virtual CPU slot(s)" in lines[1]
        assert lines[3] == "NCCL: not used (virtual slots communicate with gloo)"
    # Neither the work dir nor the checkpoint root exists yet: their parents' disk counts.
    assert checkpoint_root() == tmp_path / "home" / "checkpoints"
    assert lines[5].startswith("free disk: ")
    assert f"GiB at {tmp_path / 'work'} (worker logs)" in lines[5]
    assert f"GiB at {tmp_path / 'home' / 'checkpoints'} (checkpoints)" in lines[5]
    assert "unknown" not in lines[5]
    assert len(lines) <= 24  # one screen


def test_the_diagnosis_works_without_torch(tmp_path: Path) -> None:
    # torch blocked in a fresh interpreter: the probe and the diagnosis still answer.
    printed = _python(
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from worker_agent.diagnosis import diagnose\n"
        "from worker_agent.gpus import _probe, discover\n"
        "from worker_agent.settings import AgentSettings\n"
        "probe = _probe()\n"
        f"settings = AgentSettings(token='t', node_name='n', work_dir={str(tmp_path)!r})\n"
        "print('\\n'.join(diagnose(settings, discover('auto', probe), probe)))\n"
    )
    lines = printed.splitlines()
    assert lines[1].startswith("GPUs: none found (torch cannot be imported to ask)")
    assert lines[4].startswith("torch: cannot be imported (")
    assert lines[4].endswith("jobs here will fail")


def test_virtual_slots_are_not_probed(settings: AgentSettings) -> None:
    virtual = settings.model_copy(update={"gpus": 2})
    lines = diagnose(virtual, discover(2), None)
    assert lines[1].startswith("GPUs: not probed (--gpus 2): 2 virtual CPU slot(s) of ")
    assert lines[2] == "NVIDIA driver: not probed"
    assert lines[4].startswith("torch: ")
