"""The Kubernetes node inventory with the real `kubernetes` client against a loopback
HTTP server that answers with a recorded NodeList (tests/data/kubernetes/nodes.json):
cordoned, not Ready and tainted nodes become unschedulable, and come back."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from jigsaw.gpus import GpuSlot
from scheduler.db import session_factory, transaction
from scheduler.kube import NodeInventory, core_api
from scheduler.models.agents import register
from scheduler.models.snapshot import build_snapshot
from scheduler.orm import Event, Node
from scheduler.settings import KubernetesSettings

RECORDED = Path(__file__).parent / "data" / "kubernetes" / "nodes.json"
SELECTOR = "nvidia.com/gpu.present=true"


class FakeApiServer:
    """Serves GET /api/v1/nodes with `self.nodes`; remembers the label selectors asked."""

    def __init__(self) -> None:
        self.nodes: dict[str, Any] = json.loads(RECORDED.read_text())
        self.selectors: list[str] = []
        self.fail = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlparse(self.path)
                if url.path != "/api/v1/nodes" or owner.fail:
                    self.send_response(404 if not owner.fail else 503)
                    self.end_headers()
                    return
                owner.selectors.extend(parse_qs(url.query).get("labelSelector", []))
                body = json.dumps(owner.nodes).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    factory = session_factory(engine)
    with transaction(factory) as session:
        for name in ("gpu-node-a", "gpu-node-b", "gpu-node-c", "gpu-node-d", "workstation"):
            register(
                session,
                node_name=name,
                address=name,
                gpus=[GpuSlot(0, "H100", 80 << 30, False)],
                version="test",
            )
    return factory


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig naming the fake API server, as `kubectl config view --raw` writes."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "test", "user": {"token": "test-token"}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                "current-context": "test",
            }
        )
    )
    return path


def schedulable(factory: sessionmaker[Session]) -> dict[str, tuple[bool, str]]:
    with factory() as session:
        return {
            node.name: (node.schedulable, node.unschedulable_reason)
            for node in session.scalars(select(Node))
        }


def test_cordoned_unready_and_tainted_nodes_take_no_new_jobs_until_they_recover(
    factory: sessionmaker[Session], api_server: FakeApiServer, tmp_path: Path
) -> None:
    settings = KubernetesSettings(
        enabled=True,
        kubeconfig=kubeconfig(tmp_path / "kubeconfig", api_server.url),
        node_selector=SELECTOR,
    )
    inventory = NodeInventory(factory, settings, core_api(settings))

    changes = inventory.sync()

    assert api_server.selectors == [SELECTOR]
    assert {change.name for change in changes} == {
        "gpu-node-b",
        "gpu-node-c",
        "gpu-node-d",
        "workstation",
    }
    assert schedulable(factory) == {
        # The GPU taint is tolerated; PreferNoSchedule is only a preference.
        "gpu-node-a": (True, ""),
        "gpu-node-b": (False, "cordoned"),
        "gpu-node-c": (
            False,
            "not Ready (NodeStatusUnknown); taint node.kubernetes.io/unreachable:NoSchedule; "
            "taint node.kubernetes.io/unreachable:NoExecute",
        ),
        "gpu-node-d": (False, "taint example.com/maintenance=firmware:NoExecute"),
        "workstation": (False, f"not listed by the Kubernetes API (node selector {SELECTOR!r})"),
    }
    with factory() as session:
        snapshot = build_snapshot(session, datetime.now(UTC))
        events = session.scalars(select(Event.message).where(Event.kind == "node_unschedulable"))
        assert sorted(events)[0] == "gpu-node-b: cordoned"
    free = {gpu.node_name for gpus in snapshot.free_gpus_by_node().values() for gpu in gpus}
    assert free == {"gpu-node-a"}

    # Nothing changed: nothing is written again.
    assert inventory.sync() == []

    # `kubectl uncordon gpu-node-b`: it takes jobs again, and an event says so.
    uncordoned = copy.deepcopy(api_server.nodes)
    node_b = uncordoned["items"][1]
    del node_b["spec"]["unschedulable"]
    node_b["spec"]["taints"] = node_b["spec"]["taints"][:1]
    api_server.nodes = uncordoned
    [change] = inventory.sync()
    assert (change.name, change.schedulable) == ("gpu-node-b", True)
    assert schedulable(factory)["gpu-node-b"] == (True, "")
    with factory() as session:
        assert session.scalars(
            select(Event.message).where(Event.kind == "node_schedulable")
        ).all() == ["gpu-node-b: schedulable"]

    # An unreachable API server changes nothing (the last inventory stands).
    api_server.fail = True
    before = schedulable(factory)
    with pytest.raises(Exception, match="503"):
        inventory.sync()
    assert schedulable(factory) == before
