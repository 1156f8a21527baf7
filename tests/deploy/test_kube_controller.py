"""The Kubernetes controller's reconcile logic, against the official client's object models and the
worker template as the snp-gpu overlay renders it. No API server runs here (no kind, no etcd on
this machine); what these tests cover is listed in docs/deploy.md."""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import pytest

from api.orchestrator.kube import TEMPLATE, KubeController, object_name, plan, queue_query
from api.orchestrator.reconcile import Inputs
from api.orchestrator.spec import VersionSpec

from .test_manifests import INIT_DATA, render, validate

pytestmark = pytest.mark.skipif(importlib.util.find_spec("kubernetes") is None, reason="kubernetes not installed")
PROM = "http://prometheus:9090"


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render("snp-gpu")


@pytest.fixture(scope="module")
def template(objects: list[dict]) -> dict:
    """The template with its image pinned by digest, as an operator sets it (docs/deploy.md step 3)."""
    (t,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == TEMPLATE]
    t = copy.deepcopy(t)
    container = t["spec"]["template"]["spec"]["containers"][0]
    container["image"] = container["image"].split(":")[0] + "@sha256:" + "cd" * 32
    return t


@pytest.fixture(scope="module")
def configmaps(objects: list[dict]) -> dict[str, dict[str, str]]:
    out = {o["metadata"]["name"]: dict(o.get("data", {})) for o in objects if o["kind"] == "ConfigMap"}
    for data in out.values():
        if "BROKER_MEASUREMENT" in data:
            data["BROKER_MEASUREMENT"] = "ee" * 48
    return out


def spec(**kw: Any) -> VersionSpec:
    return VersionSpec(**{"tenant": "acme", "model": "Llama_3.2-3b", "version": "v1", "min_warm": 0, "max_replicas": 3,
                          "package": "ab" * 32, **kw})


OK = Inputs(package=True, data_key=True)


def test_a_runnable_version_gets_a_confidential_deployment_and_a_scaled_object(template: dict, configmaps: dict
                                                                               ) -> None:
    from kubernetes import client

    s = spec()
    p = plan([s], template, set(), {s.key: OK}, {"acme": None}, PROM, now=0, configmaps=configmaps)
    deployment, scaled = p.apply
    for obj in p.apply:
        validate(obj)  # Kubernetes 1.31 schema (strict) and the ScaledObject fields
    model = client.ApiClient()._ApiClient__deserialize(deployment, "V1Deployment")  # the client's own model
    assert model.metadata.name == object_name(s) and len(model.metadata.name) <= 63
    pod = deployment["spec"]["template"]
    assert pod["spec"]["runtimeClassName"] == "kata-qemu-nvidia-gpu-snp"
    # The template's (default-deny) init-data is replaced by the version's own (test_measure_overlays.py).
    init_data = template["spec"]["template"]["metadata"]["annotations"][INIT_DATA]
    assert pod["metadata"]["annotations"][INIT_DATA] not in ("", init_data)
    assert "sealed.dev/template" not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"  # the NetworkPolicy selects it
    args = pod["spec"]["containers"][0]["args"]
    assert args[-11:] == ["--tenant", "acme", "--model", "Llama_3.2-3b", "--version", "v1", "--package-dir",
                          f"/var/lib/sealed/packages/packages/{'ab' * 32}", "--unsafe-no-tenant-policy",
                          "--init-data", "/etc/sealed/init-data/cc_init_data"]
    assert args[args.index("--tee") + 1] == "snp+nvgpu"  # the overlay's TEE, from the template, pinned
    assert scaled["spec"]["scaleTargetRef"]["name"] == object_name(s)
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 3)
    trigger = scaled["spec"]["triggers"][0]["metadata"]
    assert trigger["query"] == queue_query(s) and 'version="v1"' in trigger["query"]
    assert trigger["activationThreshold"] == "0"  # any queued or unserved request wakes it from zero


def test_a_tenant_policy_becomes_a_configmap_the_workers_mount(template: dict, configmaps: dict) -> None:
    s = spec(min_warm=2)
    policy = {"document": {"payload": {}, "key_id": "a", "alg": "ed25519", "sig": "00"}, "admin_key_pem": "PEM"}
    p = plan([s], template, set(), {s.key: OK}, {"acme": policy}, PROM, now=0, configmaps=configmaps)
    configmap, deployment, scaled = p.apply
    for obj in p.apply:
        validate(obj)
    assert configmap["kind"] == "ConfigMap" and configmap["data"]["policy-admin.pub.pem"] == "PEM"
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "tenant-policy", "configMap": {"name": configmap["metadata"]["name"]}} in pod["volumes"]
    assert "--unsafe-no-tenant-policy" not in pod["containers"][0]["args"]
    assert scaled["spec"]["minReplicaCount"] == 2 and deployment["spec"]["replicas"] == 2


def test_versions_that_cannot_run_get_nothing_and_say_why_retired_ones_are_deleted(template: dict, configmaps: dict
                                                                                   ) -> None:
    live, retired, keyless = spec(), spec(version="v0", retired=True), spec(version="v2")
    existing = {("Deployment", object_name(retired)), ("ScaledObject", object_name(retired)),
                ("Deployment", "sealed-worker-gone-0000000000")}
    p = plan([live, retired, keyless], template, existing,
             {live.key: OK, retired.key: OK, keyless.key: Inputs(package=True, data_key=False)}, {}, PROM, now=0,
             configmaps=configmaps)
    assert {o["metadata"]["name"] for o in p.apply} == {object_name(live)}
    assert set(p.delete) == existing
    status = {s.version: (st, reason) for s, st, reason in p.status}
    assert status["v2"][0] == "waiting" and "no data key" in status["v2"][1]
    assert status["v1"] == ("", "")


class FakeCluster:
    def __init__(self, template: dict, configmaps: dict) -> None:
        self._template, self._configmaps, self.objects = template, configmaps, {}

    def configmaps(self) -> dict:
        return self._configmaps

    def template(self) -> dict:
        return self._template

    def managed(self) -> set[tuple[str, str]]:
        return set(self.objects)

    def apply(self, obj: dict) -> None:
        self.objects[(obj["kind"], obj["metadata"]["name"])] = obj

    def delete(self, kind: str, name: str) -> None:
        self.objects.pop((kind, name), None)


class FakeSource:
    def __init__(self) -> None:
        self.rows = [{"tenant": "acme", "model": "m", "version": "v1", "min_warm": 1, "max_replicas": 2,
                      "package": "cd" * 32}]
        self.reports: list[tuple[str, str]] = []

    def deployments(self) -> list[dict]:
        return self.rows

    def broker_tenant(self, tenant: str) -> dict:
        return {"has_key": True, "data_keys": [{"model": "m", "version": "v1"}]}

    def tenant_policy(self, tenant: str) -> None:
        return None

    def report(self, spec: VersionSpec, status: str, reason: str) -> None:
        self.reports.append((status, reason))


def test_the_controller_creates_then_deletes_on_retire(template: dict, configmaps: dict) -> None:
    cluster, source = FakeCluster(template, configmaps), FakeSource()
    controller = KubeController(cluster, source, PROM)
    controller.step(now=0)
    assert {k for k, _ in cluster.objects} == {"Deployment", "ScaledObject"}
    controller.step(now=1)
    assert len(cluster.objects) == 2
    source.rows = [{**source.rows[0], "retired": True}]
    controller.step(now=2)
    assert cluster.objects == {}
