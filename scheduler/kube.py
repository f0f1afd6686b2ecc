"""Node inventory from the Kubernetes API: cordoned, not Ready or tainted nodes take no
new jobs.

Behind `JIGSAW_KUBERNETES_ENABLED`. The scheduler leader lists the nodes (with the
official `kubernetes` client, the `kubernetes` extra) every `sync_seconds` and sets
`nodes.schedulable` of the JigSaw nodes of the same name (agents register under their
Kubernetes node name, see deploy/). Jobs already on a node that becomes unschedulable
keep running: a drain evicts pods, not the agent DaemonSet's, so the jobs' leases end as
usual and they are placed elsewhere afterwards. Only reading nodes needs RBAC (`list
nodes`, cluster-wide).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from scheduler.db import transaction
from scheduler.orm import Event, Node
from scheduler.settings import KubernetesSettings

logger = logging.getLogger(__name__)

# Taints that stop new pods (and so new jobs); PreferNoSchedule is only a preference.
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# Cordoning sets spec.unschedulable and adds this taint; reported once, as "cordoned".
_CORDON_TAINT = "node.kubernetes.io/unschedulable"
NOT_LISTED = "not listed by the Kubernetes API (node selector {selector!r})"


@dataclass(frozen=True)
class NodeStatus:
    name: str
    schedulable: bool
    reason: str = ""  # why not, when not


def node_status(node: Any, tolerated_taints: Collection[str]) -> NodeStatus:
    """Schedulability of one `V1Node` (as the client deserialized it)."""
    name = node.metadata.name
    reasons = []
    if node.spec is not None and node.spec.unschedulable:
        reasons.append("cordoned")
    ready = next(
        (c for c in (node.status.conditions or []) if c.type == "Ready"),
        None,
    ) if node.status is not None else None  # fmt: skip
    if ready is None or ready.status != "True":
        why = f" ({ready.reason})" if ready is not None and ready.reason else ""
        reasons.append(f"not Ready{why}")
    for taint in (node.spec.taints if node.spec is not None else None) or []:
        if taint.effect not in _BLOCKING_EFFECTS or taint.key in tolerated_taints:
            continue
        if taint.key == _CORDON_TAINT and "cordoned" in reasons:
            continue
        value = f"={taint.value}" if taint.value else ""
        reasons.append(f"taint {taint.key}{value}:{taint.effect}")
    return NodeStatus(name, not reasons, "; ".join(reasons)[:255])


def apply_inventory(
    session: Session, statuses: Iterable[NodeStatus], selector: str
) -> list[NodeStatus]:
    """Set `schedulable` of every JigSaw node from `statuses` (a node Kubernetes did not
    list is unschedulable); an event records each change. Returns the changes."""
    by_name = {status.name: status for status in statuses}
    changes = []
    for node in session.scalars(select(Node).order_by(Node.name)):
        status = by_name.get(node.name) or NodeStatus(
            node.name, False, NOT_LISTED.format(selector=selector)
        )
        if (node.schedulable, node.unschedulable_reason) == (status.schedulable, status.reason):
            continue
        node.schedulable, node.unschedulable_reason = status.schedulable, status.reason
        session.add(
            Event(
                kind="node_schedulable" if status.schedulable else "node_unschedulable",
                actor="kubernetes",
                message=f"{node.name}: {status.reason or 'schedulable'}",
                data={"node_id": node.id, "node": node.name},
            )
        )
        changes.append(status)
    return changes


def core_api(settings: KubernetesSettings) -> Any:
    """A CoreV1Api from the kubeconfig setting, else the pod's service account."""
    from kubernetes import client, config

    if settings.kubeconfig is not None:
        api_client = config.new_client_from_config(config_file=str(settings.kubeconfig))
    else:
        config.load_incluster_config()
        api_client = client.ApiClient()
    return client.CoreV1Api(api_client)


class NodeInventory:
    """Reads the nodes and applies them; `run_forever` repeats it every `sync_seconds`."""

    def __init__(
        self, factory: sessionmaker[Session], settings: KubernetesSettings, api: Any
    ) -> None:
        self._factory = factory
        self._settings = settings
        self._api = api

    def sync(self) -> list[NodeStatus]:
        nodes = self._api.list_node(
            label_selector=self._settings.node_selector or None, _request_timeout=30
        )
        tolerated = frozenset(self._settings.tolerated_taints)
        statuses = [node_status(node, tolerated) for node in nodes.items]
        with transaction(self._factory) as session:
            changes = apply_inventory(session, statuses, self._settings.node_selector)
        for change in changes:
            if change.schedulable:
                logger.info("node %s is schedulable again", change.name)
            else:
                logger.warning("node %s takes no new jobs: %s", change.name, change.reason)
        return changes

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync()
            except Exception:
                # The last known inventory stands; the API server may be restarting.
                logger.exception("could not read the Kubernetes node inventory; retrying")
            stop.wait(self._settings.sync_seconds)
