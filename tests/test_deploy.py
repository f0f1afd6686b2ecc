"""deploy/: the kustomize overlays render, every object validates against the Kubernetes
OpenAPI schemas (bundled by kubernetes-validate, offline), the pods follow the security
policy, the Grafana dashboard queries only metrics the service exports, and the
Dockerfile copies what exists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from sqlalchemy import Engine

from tests.conftest import UNDER_CI

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.32"
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}
# The only host-level access any pod may have, each explained in the pod's annotation.
PRIVILEGE_ANNOTATION = "jigsaw.dev/privileges"
# Each image the manifests run, by the deploy/Dockerfile target that builds it.
IMAGE_TARGETS = {"jigsaw": "control-plane", "jigsaw-agent-cuda": "agent-cuda"}


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if UNDER_CI:
            pytest.fail("kubectl is not installed")
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=["dev", "prod"])
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_overlays_render_what_the_platform_needs_and_validate(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    overlay, objects = rendered
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")

    scheduler = named(objects, "Deployment", "jigsaw-scheduler")
    assert scheduler["spec"]["replicas"] == 2
    pod = scheduler["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["args"] == ["db", "upgrade"]
    assert pod["containers"][0]["args"] == ["up"]
    agent = named(objects, "DaemonSet", "jigsaw-agent")["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    resources = agent["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] >= 1
    shm = next(v for v in agent["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    for kind, name in [
        ("Service", "jigsaw-api"),
        ("Service", "jigsaw-grpc"),
        ("ServiceAccount", "jigsaw-scheduler"),
        ("ConfigMap", "jigsaw-config"),
        ("PodDisruptionBudget", "jigsaw-scheduler"),
        ("NetworkPolicy", "default-deny-ingress"),
        ("ClusterRoleBinding", "jigsaw-node-reader"),
    ]:
        named(objects, kind, name)
    statefulsets = [o["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet"]
    secrets = {o["metadata"]["name"].rsplit("-", 1)[0] for o in objects if o["kind"] == "Secret"}
    if overlay == "dev":
        assert statefulsets == ["postgres"] and "jigsaw-database" in secrets
    else:  # the external database's Secret is created by the operator, never rendered
        assert statefulsets == [] and secrets == set()


def _pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["metadata"], o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in WORKLOADS
    ]


def test_every_pod_has_probes_resources_and_runs_unprivileged_unless_it_says_why(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _overlay, objects = rendered
    for name, meta, pod in _pods(objects):
        pod_security = pod.get("securityContext", {})
        for container in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{container['name']}"
            if container not in pod.get("initContainers", []):
                assert "livenessProbe" in container and "readinessProbe" in container, where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), where
            security = container.get("securityContext", {})
            non_root = security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
            user = security.get("runAsUser", pod_security.get("runAsUser"))
            assert non_root is True and user not in (None, 0), where
            assert security.get("privileged") is not True, where
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
        used = [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
        used += [f"hostPath {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
        if used:
            why = meta.get("annotations", {}).get(PRIVILEGE_ANNOTATION, "")
            for privilege in used:
                assert privilege.split()[0] in why, f"{name} uses {privilege} without saying why"
    # Host access is the agents' alone, in a namespace of their own.
    host_network = [name for name, _meta, pod in _pods(objects) if pod.get("hostNetwork")]
    assert host_network == ["jigsaw-agent"]
    namespaces = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Namespace"}
    labels = namespaces["jigsaw"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_rbac_only_reads_nodes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _overlay, objects = rendered
    rules = [rule for o in objects if o["kind"] in {"ClusterRole", "Role"} for rule in o["rules"]]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    agent = named(objects, "ServiceAccount", "jigsaw-agent")
    assert agent["automountServiceAccountToken"] is False


def exported_samples(engine: Engine, db_url: str, home: Path) -> set[str]:
    """Every sample name /metrics can carry: each family with its type's suffixes."""
    from api.app import create_app
    from jigsaw.gpus import GpuSlot
    from scheduler.db import session_factory, transaction
    from scheduler.models.agents import register
    from scheduler.settings import DatabaseSettings, Settings

    # With a GPU, so the efficiency gauges (undefined without capacity) are exported.
    with transaction(session_factory(engine)) as session:
        register(session, node_name="n", address="", gpus=[GpuSlot(0, "x", 1, True)], version="")
    app = create_app(Settings(home=home, database=DatabaseSettings(url=db_url)))
    names: set[str] = set()
    registry = app.state.metrics.registry
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum"))
    app.state.engine.dispose()
    # Sanity: what the scheduler side declares is among them.
    assert {"jigsaw_scheduler_round_seconds_bucket", "jigsaw_gpus", "jigsaw_jobs"} <= names
    return names


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_grafana_panel_queries_exported_metrics(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    exported = exported_samples(engine, db_url, tmp_path)
    dashboard = json.loads((DEPLOY / "grafana" / "jigsaw-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["panels"]
    used: set[str] = set()
    for panel in dashboard["panels"]:
        exprs = [target["expr"] for target in panel["targets"]]
        assert exprs, panel["title"]
        for expr in exprs:
            metrics = set(re.findall(r"\bjigsaw_[a-z0-9_]+", expr))
            assert metrics, f"{panel['title']}: {expr} names no jigsaw metric"
            assert metrics <= exported, f"{panel['title']}: {sorted(metrics - exported)}"
            used |= metrics
    # Every metric family the service exports is on the dashboard somewhere.
    families = {re.sub(r"_(bucket|count|sum|total|created)$", "", name) for name in exported}
    shown = {re.sub(r"_(bucket|count|sum|total|created)$", "", name) for name in used}
    assert families - shown == set()


def dockerfile_stages() -> dict[str, tuple[str, str]]:
    """Each stage of deploy/Dockerfile: its base image (global ARGs at their defaults) and
    its instructions (without comments)."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    head, *stages = re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", head, re.MULTILINE))
    parsed = {}
    for stage in stages:
        match = re.match(r"(\S+) AS (\S+)\n", stage)
        assert match, f"FROM {stage.splitlines()[0]}: every stage is named"
        base = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], match[1])
        instructions = re.sub(r"^#.*\n", "", stage[match.end() :], flags=re.MULTILINE)
        parsed[match[2]] = (base, instructions)
    return parsed


def test_dockerfile_copies_what_exists_and_runs_unprivileged() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from)(\S+(?: \S+)*) \S+$", dockerfile, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), f"COPY {path}: not in the repository"
    stages = dockerfile_stages()
    for target in IMAGE_TARGETS.values():
        assert "\nUSER 10001:10001\n" in stages[target][1], target
    # The manifests' images are exactly the Dockerfile's targets.
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert {image["name"] for image in base["images"]} == set(IMAGE_TARGETS)


def test_the_agent_image_is_cuda_pytorch_and_the_control_plane_image_has_no_torch() -> None:
    stages = dockerfile_stages()
    control_base, control = stages["control-plane"]
    assert control_base.startswith("python:") and "torch" not in control
    agent_base, agent = stages["agent-cuda"]
    # NVIDIA's image (the container toolkit's hooks) on Ubuntu 24.04, whose Python is 3.12.
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-base-ubuntu24\.04", agent_base)
    assert match, agent_base
    # torch comes from PyTorch's index for the base's CUDA version, before the project.
    [assignment] = re.findall(r"^\s*(torch_index=.*?)\s*\\$", agent, re.MULTILINE)
    cuda_version = agent_base.split(":")[1].split("-")[0]
    index = subprocess.run(
        ["sh", "-c", f'{assignment}; echo "$torch_index"'],
        env={"CUDA_VERSION": cuda_version, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert index == f"https://download.pytorch.org/whl/cu{match[1]}{match[2]}"
    torch_install = agent.index('--index-url "$torch_index" "torch')
    assert torch_install < agent.index("[train]")
    assert 'CMD ["agent"]' in agent


def test_gpu_nodes_run_the_cuda_agent_image_and_request_gpus(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _overlay, objects = rendered
    stages = dockerfile_stages()

    def target(image: str) -> str:
        return IMAGE_TARGETS[image.rsplit("/", 1)[-1].split(":")[0]]

    agent = named(objects, "DaemonSet", "jigsaw-agent")["spec"]["template"]["spec"]
    [container] = agent["containers"]
    assert stages[target(container["image"])][0].startswith("nvidia/cuda:")
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    scheduler = named(objects, "Deployment", "jigsaw-scheduler")["spec"]["template"]["spec"]
    for container in scheduler["initContainers"] + scheduler["containers"]:
        assert target(container["image"]) == "control-plane"
        assert "nvidia.com/gpu" not in container["resources"]["limits"]


def test_build_commands_tag_each_image_from_its_target() -> None:
    built = re.compile(r"docker build -f deploy/Dockerfile --target (\S+) -t ([^:\s]+):")
    for path in (
        ROOT / "README.md",
        DEPLOY / "Dockerfile",
        DEPLOY / "overlays/dev/kustomization.yaml",
    ):
        commands = built.findall(path.read_text())
        assert {image: target for target, image in commands} == IMAGE_TARGETS, path
