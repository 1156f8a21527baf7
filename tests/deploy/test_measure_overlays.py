"""`sealed measure snp|tdx --manifest` for each confidential overlay in deploy/ gives what the fake
hardware reports for a worker the controller starts from that overlay (issue #33).

Per overlay: the operator pins the images by digest and sets the broker's measurement (docs/deploy.md
steps 3 and 6), renders the overlay with `kubectl kustomize`, and measures one model version. The
controller (kube.plan) creates that version's worker Deployment from the same rendering. The host
(Kata's runtime, modelled here from its documented rule, not with attestation/coco_initdata.py:
hash the annotation's TOML with its `algorithm`, fit it to 32 or 48 bytes) launches the fake guest
with the pod's annotation; the worker starts with the pod's arguments, the image's ENV under the
pod's env and the downward-API file of that annotation; its start check passes, and the report its
attester hands out (fake configfs-tsm) carries exactly the value `sealed measure` printed.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from api.cli.main import build
from api.orchestrator.kube import TEMPLATE, plan
from api.orchestrator.pin import IMAGE_ENV_ANNOTATION, INIT_DATA_DIR, INIT_DATA_FILE
from api.orchestrator.reconcile import Inputs
from api.orchestrator.spec import VersionSpec
from attestation.attesters import Attester, KernelInterfaces, SnpAttester, TdxAttester
from attestation.bundle import RuntimeData
from attestation.coco_initdata import ANNOTATION
from attestation.errors import WorkloadMismatch
from attestation.snp.abi import parse_report
from attestation.snp.collect import encode_cert_table
from attestation.tdx.abi import parse_quote
from enclave_worker.cli import parse
from enclave_worker.tee import check_workload
from enclave_worker.workload_check import load_init_data
from sealed_fakes.fake_tsm import FakeTsmTree
from sealed_fakes.platform import FakePlatform

from .rego_subset import evaluate
from .test_agent_policy import RUNTIME_ENV, RUNTIME_MOUNTS, create

ROOT = Path(__file__).resolve().parents[2]
CONFIDENTIAL = ("snp", "tdx", "snp-gpu", "tdx-gpu")
WORKER_DIGEST = "sha256:" + "cd" * 32
BROKER_MEASUREMENT = "ee" * 48
BROKER_DIGEST = "sha256:" + "bc" * 32
BROKER_WORKLOAD_ID = "b1" * 32
VERSION = {"tenant": "acme", "model": "m", "version": "v1", "package": "ab" * 32}
FIELD = {"snp": "host_data", "tdx": "mr_config_id"}


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/k8s as an operator prepares it: the worker image by digest, the broker's measurement."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    root = tmp_path_factory.mktemp("deploy") / "k8s"
    shutil.copytree(ROOT / "deploy" / "k8s", root)
    kustomization = root / "base" / "kustomization.yaml"
    text = kustomization.read_text()
    pinned = text.replace("newName: registry.example.com/sealed/worker\n    newTag: 0.1.0",
                          f"newName: registry.example.com/sealed/worker\n    digest: {WORKER_DIGEST}")
    pinned = pinned.replace("newName: registry.example.com/sealed/broker\n    newTag: 0.1.0",
                            f"newName: registry.example.com/sealed/broker\n    digest: {BROKER_DIGEST}")
    pinned = pinned.replace("BROKER_MEASUREMENT=set-me-to-the-broker-measurement",
                            f"BROKER_MEASUREMENT={BROKER_MEASUREMENT}")
    pinned = pinned.replace("BROKER_WORKLOAD_ID=set-me-to-the-broker-workload-id",
                            f"BROKER_WORKLOAD_ID={BROKER_WORKLOAD_ID}")
    assert pinned.count(WORKER_DIGEST) == 1 and BROKER_MEASUREMENT in pinned and BROKER_DIGEST in pinned \
        and BROKER_WORKLOAD_ID in pinned, "the base kustomization changed"
    kustomization.write_text(pinned)
    return root


def rendered(k8s: Path, overlay: str, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    out = subprocess.run(["kubectl", "kustomize", str(k8s / "overlays" / overlay)], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(out)
    return path, [o for o in yaml.safe_load_all(out) if o]


def measure(tee: str, manifest: Path, *extra: str) -> dict[str, Any]:
    args = ["measure", tee, "--manifest", str(manifest), *(f"--{k}={v}" for k, v in VERSION.items()), "--json", *extra]
    result = CliRunner().invoke(build(), args)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def controller_pod(objects: list[dict[str, Any]], policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """The worker Deployment the controller creates for VERSION from this rendering."""
    (template,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == TEMPLATE]
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    spec = VersionSpec(**VERSION)  # type: ignore[arg-type]
    result = plan([spec], template, set(), {spec.key: Inputs(package=True, data_key=True)}, {"acme": policy},
                  "http://prometheus:9090", now=0, configmaps=configmaps)
    (deployment,) = [o for o in result.apply if o["kind"] == "Deployment"]
    return dict(deployment)


def host_sets(annotation: str, tee: str) -> bytes:
    """Kata's runtime: the TOML's digest with its own algorithm, truncated or zero-padded to the field."""
    text = gzip.decompress(base64.b64decode(annotation))
    value = hashlib.new(tomllib.loads(text.decode())["algorithm"], text).digest()
    size = 32 if tee == "snp" else 48
    return value[:size].ljust(size, b"\0")


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> FakePlatform:
    return FakePlatform.create(tmp_path_factory.mktemp("platform"), gpus=1, now=dt.datetime.now(dt.UTC))


def start_worker(deployment: dict[str, Any], tmp_path: Path) -> tuple[list[str], dict[str, str], Any]:
    """The worker as the runtime starts it from the pod: its arguments (the init-data file where the
    downward API writes the annotation), the image's ENV under the pod's env, its start check."""
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    downward = tmp_path / INIT_DATA_FILE
    downward.write_text(pod["metadata"]["annotations"][ANNOTATION])
    argv = [str(downward) if a == f"{INIT_DATA_DIR}/{INIT_DATA_FILE}" else a for a in container["args"]]
    environ = {**json.loads(deployment["metadata"]["annotations"][IMAGE_ENV_ANNOTATION]),
               **{e["name"]: e["value"] for e in container["env"] if "value" in e}, "POD_IP": "10.0.0.7"}
    settings = parse(argv)[1]
    check_workload(settings, argv, environ)
    return argv, environ, settings


def reported(platform: FakePlatform, tee: str, launched: bytes, settings: Any, tmp_path: Path) -> bytes:
    """The field the fake hardware signs in the report the worker's attester hands out."""
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", sev_guest=tmp_path / "absent")
    table = encode_cert_table({"vcek": platform.vcek})

    def report(data: bytes, vmpl: int) -> tuple[bytes, bytes | None]:
        if tee == "snp":
            return platform.snp_report(data, vmpl, host_data=launched), table
        return platform.tdx_quote(data, mr_config_id=launched), None

    # The digest the worker requires of its own reports (enclave_worker/tee.py, make_attester).
    attester = Attester(SnpAttester(kernel) if tee == "snp" else TdxAttester(kernel),
                        init_data_digest=load_init_data(settings.init_data).digest_for(tee))
    with FakeTsmTree(kernel.tsm_dir, "sev_guest" if tee == "snp" else "tdx_guest", report):
        bundle = attester.bundle(RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32)))
    if tee == "snp":
        return parse_report(bundle.cpu_evidence).host_data
    return parse_quote(bundle.cpu_evidence).body.mr_config_id


@pytest.mark.parametrize("overlay", CONFIDENTIAL)
def test_measure_matches_what_the_fake_hardware_reports_for_the_controllers_worker(
        overlay: str, k8s: Path, platform: FakePlatform, tmp_path: Path) -> None:
    tee = overlay.split("-")[0]
    manifest, objects = rendered(k8s, overlay, tmp_path)
    measured = measure(tee, manifest)
    deployment = controller_pod(objects)
    pod = deployment["spec"]["template"]
    annotation = pod["metadata"]["annotations"][ANNOTATION]
    assert measured["init_data_annotation"] == annotation
    launched = host_sets(annotation, tee)
    argv, environ, settings = start_worker(deployment, tmp_path)
    assert measured[FIELD[tee]] == launched.hex() == reported(platform, tee, launched, settings, tmp_path).hex()
    # Field by field, what the digest names is what runs.
    (container,) = pod["spec"]["containers"]
    doc = measured["workload"]
    assert doc["image"] == container["image"] == f"registry.example.com/sealed/worker@{WORKER_DIGEST}"
    assert doc["argv"] == [a for a in argv if a != argv[argv.index("--init-data") + 1] and a != "--init-data"]
    assert doc["env"] == {k: v for k, v in environ.items() if k.startswith(("SEALED_", "PYTHON"))}
    assert doc["env"]["SEALED_TEE"] == {"snp": "snp", "tdx": "tdx"}[tee] + ("+nvgpu" if "gpu" in overlay else "")
    assert doc["measured_config"] == json.loads(json.dumps(settings.measured_config()))
    assert doc["measured_config"]["broker"] == {"tee": tee, "measurements": [BROKER_MEASUREMENT],
                                                "workload_ids": [BROKER_WORKLOAD_ID]}
    toml = tomllib.loads(gzip.decompress(base64.b64decode(annotation)).decode())
    policy = toml["data"]["policy.rego"]
    assert doc["agent_policy_digest"] == measured["agent_policy_sha256"] == hashlib.sha256(policy.encode()).hexdigest()
    # The agent policy the guest enforces admits this worker as the runtime creates it (the image's
    # entrypoint and the pod's arguments; the image's ENV under the pod's; the pod's volumes), nothing else.
    runtime = create("container", [*container["command"], *container["args"]], image=container["image"],
                     env=[*(f"{k}={v}" for k, v in environ.items()), *RUNTIME_ENV],
                     mounts=[*RUNTIME_MOUNTS, *({"destination": m["mountPath"]} for m in container["volumeMounts"])])
    assert evaluate(policy, "CreateContainerRequest", runtime)
    assert not evaluate(policy, "CreateContainerRequest", {**runtime, "OCI": {
        **runtime["OCI"], "Process": {**runtime["OCI"]["Process"], "Args": container["args"]}}})
    assert not evaluate(policy, "CreateContainerRequest", create("container", ["sh"], name="debug"))
    assert not evaluate(policy, "ExecProcessRequest", {"process": {"Args": ["sh"]}})


def test_an_argument_changed_after_pinning_is_refused_by_the_policy_and_the_worker(
        k8s: Path, tmp_path: Path) -> None:
    """The operator edits the pinned Deployment (another broker) and keeps the measured annotation."""
    _, objects = rendered(k8s, "snp", tmp_path)
    deployment = controller_pod(objects)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    policy = tomllib.loads(gzip.decompress(base64.b64decode(
        deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION])).decode())["data"]["policy.rego"]
    container["args"] = [a.replace("sealed-broker.sealed.svc", "evil.example") for a in container["args"]]
    changed = create("container", [*container["command"], *container["args"]], image=container["image"])
    assert not evaluate(policy, "CreateContainerRequest", changed)
    with pytest.raises(WorkloadMismatch, match="arguments differ"):
        start_worker(deployment, tmp_path)


def test_a_guest_launched_with_other_init_data_hands_out_no_report(k8s: Path, platform: FakePlatform,
                                                                   tmp_path: Path) -> None:
    """The host launches the guest with another version's init-data (whose digest the tenant allows,
    say) and hands the worker this one's: no report leaves the worker."""
    _, objects = rendered(k8s, "tdx", tmp_path)
    ours = controller_pod(objects)
    other_spec = VersionSpec(**{**VERSION, "version": "v2"})  # type: ignore[arg-type]
    (template,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == TEMPLATE]
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    result = plan([other_spec], template, set(), {other_spec.key: Inputs(True, True)}, {"acme": None}, "http://p", 0,
                  configmaps=configmaps)
    other = next(o for o in result.apply if o["kind"] == "Deployment")
    launched = host_sets(other["spec"]["template"]["metadata"]["annotations"][ANNOTATION], "tdx")
    _, _, settings = start_worker(ours, tmp_path)
    with pytest.raises(WorkloadMismatch, match="other init-data"):
        reported(platform, "tdx", launched, settings, tmp_path)


def test_the_tenants_policy_admin_key_is_in_the_digest(k8s: Path, tmp_path: Path) -> None:
    manifest, objects = rendered(k8s, "snp", tmp_path)
    key = tmp_path / "admin.pub.pem"
    key.write_text("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n"
                   "-----END PUBLIC KEY-----\n")
    with_key = measure("snp", manifest, "--policy-admin-key", str(key))
    assert with_key["host_data"] != measure("snp", manifest)["host_data"]
    policy = {"document": {"payload": {}, "key_id": "a", "alg": "ed25519", "sig": "00"},
              "admin_key_pem": key.read_text()}
    deployment = controller_pod(objects, policy)
    assert with_key["host_data"] == host_sets(deployment["spec"]["template"]["metadata"]["annotations"][ANNOTATION],
                                              "snp").hex()


def test_an_unpinned_image_is_refused_by_measure_and_the_controller(tmp_path: Path) -> None:
    """As the repository ships it (image by tag), no confidential worker can be pinned."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    manifest, objects = rendered(ROOT / "deploy" / "k8s", "snp", tmp_path)
    result = CliRunner().invoke(build(), ["measure", "snp", "--manifest", str(manifest),
                                          *(f"--{k}={v}" for k, v in VERSION.items())])
    assert result.exit_code != 0 and "pinned by digest" in result.output, result.output
    (template,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == TEMPLATE]
    spec = VersionSpec(**VERSION)  # type: ignore[arg-type]
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    result_plan = plan([spec], template, set(), {spec.key: Inputs(True, True)}, {"acme": None}, "http://p", 0,
                       configmaps=configmaps)
    assert result_plan.apply == ()
    ((_, status, reason),) = result_plan.status
    assert status == "failing" and "cannot be pinned" in reason and "pinned by digest" in reason


def test_the_worker_process_refuses_a_pod_whose_agent_policy_was_swapped(k8s: Path, platform: FakePlatform,
                                                                          tmp_path: Path) -> None:
    """The host keeps the pod's Sealed document but launches it with an allow-all agent policy (a
    TOML whose digest the hardware then reports): the real worker process (fake SNP) exits at start."""
    import sys

    from protocol.exit_codes import EXIT_CONFIG_ERROR

    _, objects = rendered(k8s, "snp", tmp_path)
    deployment = controller_pod(objects)
    pod = deployment["spec"]["template"]
    text = gzip.decompress(base64.b64decode(pod["metadata"]["annotations"][ANNOTATION])).decode()
    policy = tomllib.loads(text)["data"]["policy.rego"]
    swapped = tmp_path / "swapped.toml"
    swapped.write_text(text.replace(policy, "package agent_policy\n\ndefault ExecProcessRequest := true\n"))
    (container,) = pod["spec"]["containers"]
    argv = [str(swapped) if a == f"{INIT_DATA_DIR}/{INIT_DATA_FILE}" else a for a in container["args"]]
    harness = [sys.executable, "-m", "tests.enclave_worker.fake_tee_worker", "--platform", str(platform.root)]
    run = subprocess.run([*harness, "--cpu", "snp", "--launch-init-data", str(swapped), *argv],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == EXIT_CONFIG_ERROR, run.stderr[-2000:]
    assert "refusing to start: WorkloadMismatch: the CoCo init-data's policy.rego is not the agent policy" in run.stderr


def test_tdx_rtmrs_and_mrconfigid_in_one_output_match_the_fake_td(k8s: Path, platform: FakePlatform,
                                                                   tmp_path: Path) -> None:
    """`--ccel` (a CC event log captured from a guest of the runtime class; here the real capture
    the fake TD replays to) adds RTMR0-3 beside MRCONFIGID; each equals the fake TD's quote."""
    ccel = ROOT / "tests" / "vectors" / "tdx-ccel"
    manifest, objects = rendered(k8s, "tdx-gpu", tmp_path)
    measured = measure("tdx", manifest, "--ccel", str(ccel / "ccel_data.dat"), "--acpi-table",
                       str(ccel / "ccel_table.dat"))
    annotation = controller_pod(objects)["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    quote = parse_quote(platform.tdx_quote(bytes(64), (ccel / "ccel_data.dat").read_bytes(),
                                           mr_config_id=host_sets(annotation, "tdx")))
    assert measured["rtmrs"] == [r.hex() for r in quote.body.rtmrs]
    assert measured["mr_config_id"] == quote.body.mr_config_id.hex()


@pytest.mark.parametrize(("tee", "overlay", "message"), [
    ("tdx", "snp", "run on 'snp', not 'tdx'"),
    ("snp", "dev", "not a confidential overlay"),
])
def test_measure_refuses_an_overlay_whose_workers_do_not_run_there(k8s: Path, tmp_path: Path, tee: str, overlay: str,
                                                                   message: str) -> None:
    manifest, _ = rendered(k8s, overlay, tmp_path)
    result = CliRunner().invoke(build(), ["measure", tee, "--manifest", str(manifest),
                                          *(f"--{k}={v}" for k, v in VERSION.items())])
    assert result.exit_code != 0 and message in " ".join(result.output.split()), result.output
