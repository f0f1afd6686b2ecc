"""GPU slot discovery and the agent's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from jigsaw.proto.v2 import agent_pb2
from worker_agent.gpus import (
    MAX_AUTO_VIRTUAL_SLOTS,
    VIRTUAL_KIND,
    discover,
    total_memory_bytes,
)
from worker_agent.settings import AgentSettings
from worker_agent.wire import gpu


def test_n_virtual_slots_share_the_memory() -> None:
    slots = discover(3)
    assert [slot.index for slot in slots] == [0, 1, 2]
    assert all(
        slot.virtual and slot.kind == VIRTUAL_KIND and slot.device == "cpu" for slot in slots
    )
    assert slots[0].memory_bytes == total_memory_bytes() // 3 > 0
    assert gpu(slots[2]) == agent_pb2.Gpu(
        index=2,
        kind=VIRTUAL_KIND,
        memory_bytes=slots[2].memory_bytes,
        virtual=True,
        sharing=agent_pb2.SHARING_TIME_SLICED,
        max_jobs=2,
    )


def test_auto_finds_the_cuda_devices_or_a_few_virtual_slots() -> None:
    slots = discover("auto")
    if torch.cuda.is_available():
        assert len(slots) == torch.cuda.device_count()
        assert [slot.device for slot in slots] == [f"cuda:{i}" for i in range(len(slots))]
        assert not any(slot.virtual for slot in slots)
    else:
        assert 1 <= len(slots) <= MAX_AUTO_VIRTUAL_SLOTS
        assert all(slot.virtual for slot in slots)


def test_settings_need_exactly_one_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JIGSAW_AGENT_TOKEN", raising=False)
    monkeypatch.delenv("JIGSAW_AGENT_TOKEN_FILE", raising=False)
    with pytest.raises(ValidationError, match="exactly one of JIGSAW_AGENT_TOKEN"):
        AgentSettings()
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    with pytest.raises(ValidationError, match="exactly one"):
        AgentSettings(token="t", token_file=token_file)
    with pytest.raises(ValidationError, match="JIGSAW_AGENT_TOKEN is empty"):
        AgentSettings(token=" ")
    assert AgentSettings(token_file=token_file).bearer_token() == "from-a-file"
    monkeypatch.setenv("JIGSAW_AGENT_TOKEN", "from-the-env")
    monkeypatch.setenv("JIGSAW_AGENT_GPUS", "2")
    settings = AgentSettings()
    assert (settings.bearer_token(), settings.gpus) == ("from-the-env", 2)
    assert "from-the-env" not in repr(settings)


def test_tls_settings_must_be_consistent(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    AgentSettings(token="t", tls_ca=pem)
    AgentSettings(token="t", tls_ca=pem, tls_cert=pem, tls_key=pem)
    with pytest.raises(ValidationError, match="both tls_cert and tls_key"):
        AgentSettings(token="t", tls_ca=pem, tls_cert=pem)
    with pytest.raises(ValidationError, match="needs tls_ca"):
        AgentSettings(token="t", tls_cert=pem, tls_key=pem)
    with pytest.raises(ValidationError, match="not a readable file"):
        AgentSettings(token="t", tls_ca=tmp_path / "missing.pem")
