"""deploy/: every Kustomize overlay renders, validates against the Kubernetes 1.31 schemas, and
keeps the confidential workers confidential; the Dockerfiles are multi-stage, non-root, pinned."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "snp", "tdx", "snp-gpu", "tdx-gpu")
RUNTIME_CLASS = {"snp": "kata-qemu-snp", "tdx": "kata-qemu-tdx", "snp-gpu": "kata-qemu-nvidia-gpu-snp",
                 "tdx-gpu": "kata-qemu-nvidia-gpu-tdx"}
TEE = {"dev": "sim", "snp": "snp", "tdx": "tdx", "snp-gpu": "snp+nvgpu", "tdx-gpu": "tdx+nvgpu"}
INIT_DATA = "io.katacontainers.config.hypervisor.cc_init_data"
K8S_VERSION = "1.31.0"


def render(overlay: str) -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         check=True, timeout=120)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pods(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [(o, o["spec"]["template"]) for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def workers(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [(o, t) for o, t in pods(objects) if t["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


# KEDA's CRD is not in the Kubernetes schemas: the ScaledObject fields we use, checked here.
SCALED_OBJECT_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
        "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                 "properties": {
                     "scaleTargetRef": {"type": "object", "required": ["name"],
                                        "properties": {"name": {"type": "string", "minLength": 1}}},
                     "minReplicaCount": {"type": "integer", "minimum": 0},
                     "maxReplicaCount": {"type": "integer", "minimum": 1},
                     "pollingInterval": {"type": "integer"}, "cooldownPeriod": {"type": "integer"},
                     "advanced": {"type": "object"},
                     "triggers": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["type", "metadata"],
                         "properties": {"type": {"const": "prometheus"}, "metadata": {
                             "type": "object", "required": ["serverAddress", "query", "threshold"],
                             "additionalProperties": {"type": "string"}}}}}}},
    },
}


def validate(obj: dict) -> None:
    import jsonschema
    import kubernetes_validate

    if obj["apiVersion"].startswith("keda.sh/"):
        jsonschema.validate(obj, SCALED_OBJECT_SCHEMA)
        assert obj["spec"].get("minReplicaCount", 0) <= obj["spec"]["maxReplicaCount"]
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_validates_against_kubernetes_1_31(overlay: str) -> None:
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed")
    objects = render(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "ScaledObject"} <= kinds
    for obj in objects:
        validate(obj)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_non_root_with_a_read_only_root_and_no_privilege(overlay: str) -> None:
    for obj, pod in pods(render(overlay)):
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc.get("privileged", False) is False and sc["capabilities"]["drop"] == ["ALL"]
            assert c["image"].startswith("registry.example.com/sealed/") and ":" in c["image"]
        if obj["metadata"]["name"] != "sealed-controller":
            assert spec.get("automountServiceAccountToken") is False, obj["metadata"]["name"]


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "dev"])
def test_confidential_workers_have_kata_init_data_tee_and_a_network_policy(overlay: str) -> None:
    from deploy_initdata import annotation_value

    objects = render(overlay)
    found = workers(objects)
    assert found, "no worker pod in the overlay"
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    expected_init_data = annotation_value((K8S / "components" / "confidential" / "initdata.toml").read_text())
    for _, pod in found:
        spec, labels = pod["spec"], pod["metadata"]["labels"]
        assert spec["runtimeClassName"] == RUNTIME_CLASS[overlay]
        assert pod["metadata"]["annotations"][INIT_DATA] == expected_init_data
        (container,) = [c for c in spec["containers"] if c["name"] == "worker"]
        assert {"name": "SEALED_TEE", "value": TEE[overlay]} in container["env"]
        assert not container["securityContext"].get("privileged", False)
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        assert not any("hostPath" in v for v in spec.get("volumes", []))
        if overlay.endswith("-gpu"):
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        # Selected by a policy that admits the gateway only.
        selecting = [p for p in policies if _matches(p["spec"]["podSelector"], labels)
                     and p["spec"]["podSelector"]]
        assert selecting, "no NetworkPolicy selects the worker"
        for p in selecting:
            for rule in p["spec"].get("ingress", []):
                assert rule["from"] == [{"podSelector": {"matchLabels":
                                                         {"app.kubernetes.io/component": "gateway"}}}]


def test_dev_workers_run_the_simulated_tee_without_a_kata_runtime() -> None:
    for _, pod in workers(render("dev")):
        assert "runtimeClassName" not in pod["spec"]
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
        assert {"name": "SEALED_TEE", "value": "sim"} in container["env"]


def test_the_broker_admits_workers_and_admins_only() -> None:
    objects = render("snp")
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"
                 and o["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component") == "broker"]
    sources = [f["podSelector"]["matchLabels"] for rule in policy["spec"]["ingress"] for f in rule["from"]]
    assert sources == [{"app.kubernetes.io/component": "worker"}, {"sealed.dev/broker-admin": "true"}]
    admins = [o["metadata"]["name"] for o, pod in pods(objects)
              if pod["metadata"]["labels"].get("sealed.dev/broker-admin") == "true"]
    assert admins == ["sealed-controller"]
    assert any(o["kind"] == "NetworkPolicy" and o["spec"]["podSelector"] == {} for o in objects), "default deny"


def test_the_init_data_patch_is_the_rendering_of_initdata_toml() -> None:
    from deploy_initdata import patch_text

    here = K8S / "components" / "confidential"
    assert (here / "initdata-patch.yaml").read_text() == patch_text((here / "initdata.toml").read_text())


@pytest.mark.parametrize("role", ["gateway", "broker", "worker"])
def test_dockerfiles_are_multi_stage_non_root_and_pinned(role: str) -> None:
    text = (ROOT / "deploy" / "docker" / f"Dockerfile.{role}").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(froms) >= 2, "multi-stage"
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    assert re.search(r"^USER 10001:10001$", text, re.M), "non-root"
    assert "latest" not in text


BROKER_TEE = {"snp": "snp", "tdx": "tdx", "snp-gpu": "snp", "tdx-gpu": "tdx"}
BROKER_RUNTIME_CLASS = {"snp": "kata-qemu-snp", "tdx": "kata-qemu-tdx", "snp-gpu": "kata-qemu-snp",
                        "tdx-gpu": "kata-qemu-tdx"}


def _broker(objects: list[dict]) -> tuple[dict, dict]:
    (pod,) = [t for o, t in pods(objects) if o["metadata"]["name"] == "sealed-broker"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "broker"]
    return pod, container


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "dev"])
def test_the_broker_is_a_confidential_workload_in_the_workers_tee(overlay: str) -> None:
    """The broker runs under a Kata runtime class of the workers' TEE and attests with it (--tee);
    workers pin its TEE and measurement (measured configuration)."""
    objects = render(overlay)
    pod, container = _broker(objects)
    assert pod["spec"]["runtimeClassName"] == BROKER_RUNTIME_CLASS[overlay]
    args = container["args"]
    assert args[args.index("--tee") + 1] == BROKER_TEE[overlay]
    assert "--sim-platform-signing-key" not in args and "--unsafe-sim-reseal" not in args
    # Its own init-data: the pod's annotation, read back through a downward-API file (--init-data).
    assert args[args.index("--init-data") + 1] == "/etc/sealed/init-data/cc_init_data"
    assert INIT_DATA in pod["metadata"]["annotations"] and container["command"] == ["python", "-m", "key_broker"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "init-data"]
    assert volume["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == f"metadata.annotations['{INIT_DATA}']"
    for _, worker in workers(objects):
        (c,) = [c for c in worker["spec"]["containers"] if c["name"] == "worker"]
        assert "--broker-tee" in c["args"] and "--broker-measurement" in c["args"]
        assert c["args"][c["args"].index("--broker-workload-id") + 1] == "$(BROKER_WORKLOAD_ID)"


def test_the_dev_broker_runs_the_simulated_tee_with_its_platform_key() -> None:
    pod, container = _broker(render("dev"))
    assert "runtimeClassName" not in pod["spec"]
    args = container["args"]
    assert args[args.index("--tee") + 1] == "sim" and "--sim-platform-signing-key" in args
    assert "--init-data" not in args  # the simulated TEE has no init-data field, so no workload id


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != "dev"])
def test_the_templates_own_init_data_lets_no_container_run(overlay: str) -> None:
    """The template's pod is never a worker: the controller gives each version's pod its own
    init-data (test_measure_overlays.py). Until then the agent must refuse every container."""
    import base64
    import gzip
    import tomllib

    from .rego_subset import evaluate
    from .test_agent_policy import create

    (_, pod), = workers(render(overlay))
    toml = tomllib.loads(gzip.decompress(base64.b64decode(pod["metadata"]["annotations"][INIT_DATA])).decode())
    policy = toml["data"]["policy.rego"]
    (container,) = pod["spec"]["containers"]
    for request, inp in [("CreateContainerRequest", create("container", container["args"], image=container["image"])),
                         ("CreateContainerRequest", create("container", ["sh"], name="debug")),
                         ("PullImageRequest", {"image": container["image"]}),
                         ("ExecProcessRequest", {"process": {"Args": ["sh"]}}),
                         ("CopyFileRequest", {"path": "/etc/passwd"})]:
        assert not evaluate(policy, request, inp), request
