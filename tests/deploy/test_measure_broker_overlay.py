"""`sealed measure snp|tdx --manifest ... --broker` gives what the fake hardware reports for the key
broker started from that overlay, and the workers of the same overlay pin it (issue #32 on #33).

The operator renders the overlay, measures the broker's pod and sets the printed annotation on it
(docs/deploy.md, step 6). The host (Kata's runtime, modelled from its documented rule in
test_measure_overlays.host_sets) launches the fake guest with that annotation; the broker starts
with the pod's command line (the kubelet's `$(VAR)` expanded from the ConfigMap), the image's ENV
under the pod's env, the operator's credentials from its Secret and the downward-API file of the
annotation; its start check passes, and the report its attester hands out (fake /dev/sev-guest, fake
configfs-tsm for TDX) carries exactly the value `sealed measure` printed. That value, set as
BROKER_WORKLOAD_ID, is in every worker's measured configuration.
"""

from __future__ import annotations

import base64
import fcntl
import gzip
import json
import os
import secrets
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from api.orchestrator.pin import IMAGE_ENV_ANNOTATION, INIT_DATA_DIR, INIT_DATA_FILE, expand_refs
from attestation.bundle import RuntimeData
from attestation.coco_initdata import ANNOTATION
from attestation.errors import WorkloadMismatch
from attestation.snp.abi import parse_report
from attestation.snp.collect import encode_cert_table
from attestation.tdx.abi import parse_quote
from key_broker.__main__ import parse, settings_from
from key_broker.platform import open_platform
from key_broker.workload_check import check_broker_workload
from sealed_fakes.fake_sev_guest import FakeSevGuest
from sealed_fakes.fake_tsm import FakeTsmTree
from sealed_fakes.platform import SNP_MEASUREMENT, FakePlatform

from .rego_subset import evaluate
from .test_agent_policy import RUNTIME_ENV, RUNTIME_MOUNTS, create
from .test_measure_overlays import (
    BROKER_DIGEST,
    BROKER_WORKLOAD_ID,
    CONFIDENTIAL,
    FIELD,
    controller_pod,
    host_sets,
    k8s,
    measure,
    platform,
    rendered,
)

__all__ = ["k8s", "platform"]  # the module fixtures this file shares


def measure_broker(tee: str, manifest: Path) -> dict[str, Any]:
    from typer.testing import CliRunner

    from api.cli.main import build

    result = CliRunner().invoke(build(), ["measure", tee, "--manifest", str(manifest), "--broker", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def broker_pod(objects: list[dict[str, Any]], annotation: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The broker Deployment as the operator applies it: the measured annotation set on its pod."""
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "sealed-broker"]
    deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION] = annotation
    return deployment, {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}


def start_broker(deployment: dict[str, Any], configmaps: dict[str, Any], tmp_path: Path,
                 kernel: list[str]) -> tuple[Any, list[str], dict[str, str]]:
    """The broker as the runtime starts it from the pod; its start check; its settings."""
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    downward = tmp_path / INIT_DATA_FILE
    downward.write_text(pod["metadata"]["annotations"][ANNOTATION])
    env = {e["name"]: e["value"] if "value" in e else configmaps[ref["name"]][ref["key"]]
           for e in container["env"] if "value" in e or (ref := e["valueFrom"].get("configMapKeyRef"))}
    argv = [str(downward) if a == f"{INIT_DATA_DIR}/{INIT_DATA_FILE}" else expand_refs(a, env)
            for a in container["args"]]
    secrets_env = {name: secrets.token_urlsafe(32) for name in ("SEALED_BROKER_ADMIN_TOKEN", "SEALED_VAULT_TOKEN")}
    environ = {**json.loads(deployment["metadata"]["annotations"][IMAGE_ENV_ANNOTATION]), **env, **secrets_env}
    full = [*argv, *kernel]
    settings = settings_from(parse(full), secrets_env)
    check_broker_workload(settings, full, environ)
    return settings, argv, environ


def reported(platform: FakePlatform, tee: str, launched: bytes, deployment: dict[str, Any],
             configmaps: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, Any]:
    """The field the fake hardware signs in the report the broker's own attester hands out."""
    runtime = RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32))
    if tee == "snp":
        device = FakeSevGuest(tmp_path / "dev" / "sev-guest",
                              lambda data, vmpl: platform.snp_report(data, vmpl, host_data=launched),
                              encode_cert_table({"vcek": platform.vcek}), launch_measurement=SNP_MEASUREMENT)
        monkeypatch.setattr(fcntl, "ioctl", device.router(fcntl.ioctl))
        kernel = ["--tsm-dir", str(tmp_path / "no-configfs"), "--sev-guest-device", str(device.device)]
        settings, argv, environ = start_broker(deployment, configmaps, tmp_path, kernel)
        bundle = open_platform(settings).attester.bundle(runtime)
        return parse_report(bundle.cpu_evidence).host_data, (argv, environ)
    kernel = ["--tsm-dir", str(tmp_path / "tsm"), "--tsm-entry", "sealed", "--ccel-table", str(tmp_path / "none"),
              "--ccel-data", str(tmp_path / "none")]
    def quote(data: bytes, _: int) -> tuple[bytes, None]:
        return platform.tdx_quote(data, mr_config_id=launched), None

    with FakeTsmTree(tmp_path / "tsm", "tdx_guest", quote):
        settings, argv, environ = start_broker(deployment, configmaps, tmp_path, kernel)
        attester = open_platform(settings).attester  # it reads its own MRTD from a first quote
    # The fake tree answers one sequential reader and never the same attribute twice in a row (its
    # FIFO may still be draining); a fresh tree serves the broker's next quote, as configfs would.
    with FakeTsmTree(tmp_path / "tsm", "tdx_guest", quote):
        bundle = attester.bundle(runtime)
    return parse_quote(bundle.cpu_evidence).body.mr_config_id, (argv, environ)


@pytest.mark.parametrize("overlay", CONFIDENTIAL)
def test_measure_broker_matches_what_the_fake_hardware_reports_and_workers_pin_it(
        overlay: str, k8s: Path, platform: FakePlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tee = overlay.split("-")[0]
    manifest, objects = rendered(k8s, overlay, tmp_path)
    measured = measure_broker(tee, manifest)
    assert measured["role"] == "key-broker"
    deployment, configmaps = broker_pod(objects, measured["init_data_annotation"])
    launched = host_sets(measured["init_data_annotation"], tee)
    value, (argv, environ) = reported(platform, tee, launched, deployment, configmaps, tmp_path, monkeypatch)
    assert measured[FIELD[tee]] == launched.hex() == value.hex()
    # Field by field, what the digest names is what runs.
    doc = measured["workload"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert doc["image"] == container["image"] == f"registry.example.com/sealed/broker@{BROKER_DIGEST}"
    assert doc["argv"] == [a for a in argv if a != argv[argv.index("--init-data") + 1] and a != "--init-data"]
    assert "$(VAULT_URL)" not in doc["argv"] and doc["argv"][doc["argv"].index("--tee") + 1] == tee
    assert doc["env"] == {k: v for k, v in environ.items() if k.startswith("PYTHON")}  # no credential
    assert doc["measured_config"]["tee"] == tee and doc["measured_config"]["role"] == "key-broker"
    # The agent policy admits the broker as the runtime creates it, and nothing else.
    policy = tomllib.loads(gzip.decompress(base64.b64decode(measured["init_data_annotation"])).decode())
    rego = policy["data"]["policy.rego"]
    request = create("container", [*container["command"], *argv[:argv.index("--init-data")], "--init-data",
                                   f"{INIT_DATA_DIR}/{INIT_DATA_FILE}"], name="broker", image=container["image"],
                     env=[*(f"{k}={v}" for k, v in environ.items()), *RUNTIME_ENV],
                     mounts=[*RUNTIME_MOUNTS, *({"destination": m["mountPath"]} for m in container["volumeMounts"])])
    assert evaluate(rego, "CreateContainerRequest", request)
    unsafe = create("container", [*request["OCI"]["Process"]["Args"], "--unsafe-dev-mode"], name="broker",
                    image=container["image"], env=request["OCI"]["Process"]["Env"], mounts=request["OCI"]["Mounts"])
    assert not evaluate(rego, "CreateContainerRequest", unsafe)
    assert not evaluate(rego, "ExecProcessRequest", {"process": {"Args": ["sh"]}})
    # The operator sets it as BROKER_WORKLOAD_ID; every worker of the overlay pins it (measured).
    pinned = tmp_path / "pinned"
    shutil.copytree(k8s, pinned)
    kustomization = pinned / "base" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace(BROKER_WORKLOAD_ID, measured[FIELD[tee]]))
    worker = measure(tee, rendered(pinned, overlay, tmp_path)[0])
    assert worker["workload"]["measured_config"]["broker"]["workload_ids"] == [measured[FIELD[tee]]]


def test_a_broker_argument_changed_after_measuring_is_refused_by_the_policy_and_the_broker(
        k8s: Path, tmp_path: Path) -> None:
    """The operator points the measured broker at another OpenBao and keeps the annotation."""
    manifest, objects = rendered(k8s, "snp", tmp_path)
    measured = measure_broker("snp", manifest)
    deployment, configmaps = broker_pod(objects, measured["init_data_annotation"])
    (config,) = [name for name in configmaps if name.startswith("sealed-config")]  # kustomize's hashed name
    configmaps[config] = {**configmaps[config], "VAULT_URL": "https://bao.evil.example"}
    with pytest.raises(WorkloadMismatch, match="arguments differ"):
        start_broker(deployment, configmaps, tmp_path, [])


def test_the_shipped_broker_init_data_lets_no_container_run(k8s: Path, tmp_path: Path) -> None:
    """Until the operator sets the measured annotation, the broker pod runs nothing, and a broker
    handed that init-data refuses to start."""
    _, objects = rendered(k8s, "tdx", tmp_path)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "sealed-broker"]
    annotation = deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    rego = tomllib.loads(gzip.decompress(base64.b64decode(annotation)).decode())["data"]["policy.rego"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert not evaluate(rego, "CreateContainerRequest", create("container", [*container["command"]], name="broker",
                                                               image=container["image"]))
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    with pytest.raises(WorkloadMismatch, match=r"no sealed-broker\.json"):
        start_broker(deployment, configmaps, tmp_path, [])
    assert controller_pod(objects)  # the workers' side of the same rendering still pins
