"""`sealed measure snp|tdx --manifest`: the workload values of a worker from a deploy overlay.

From a rendered overlay (`kubectl kustomize deploy/k8s/overlays/snp` with the images pinned by
digest) and one model version, this builds the worker Deployment exactly as the controller does
(kube.worker_deployment, then pin.pin): literal arguments and environment, the generated Kata agent
policy, the Sealed workload document and the CoCo init-data TOML, hence the SNP HOST_DATA and the
TDX MRCONFIGID the pod's guest reports. The launch digest (firmware, kernel) comes from `--ovmf`
(SNP) and the RTMRs from `--ccel` (TDX) as before; they do not depend on the pod.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import typer

from api.orchestrator.broker_pod import PinnedBroker
from api.orchestrator.pin import PinError, PinnedWorker, is_confidential

MANIFEST_HELP = "a rendered overlay (kubectl kustomize output) holding the worker template and its ConfigMaps"
BROKER_HELP = ("with --manifest: the key broker's pod instead of a worker's (its HOST_DATA / MRCONFIGID is the "
               "broker workload id workers pin with --broker-workload-id)")


def _image_env(image_env: list[str]) -> dict[str, str] | None:
    if not image_env:
        return None
    env = {}
    for item in image_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r}: use NAME=VALUE", param_hint="--image-env")
        env[name] = value
    return env


def broker_from_manifest(tee: str, manifest: Path, image_env: list[str]) -> PinnedBroker:
    """The key broker's Deployment of this overlay, pinned (api/orchestrator/broker_pod.py)."""
    import yaml

    from api.orchestrator.broker_pod import broker_from_objects

    objects = [o for o in yaml.safe_load_all(manifest.read_text()) if isinstance(o, dict)]
    try:
        pinned = broker_from_objects(objects, _image_env(image_env))
    except PinError as exc:
        raise typer.BadParameter(str(exc), param_hint="--manifest") from None
    if pinned.broker.measured_config.get("tee") != tee:
        raise typer.BadParameter(f"the overlay's broker runs on {pinned.broker.measured_config.get('tee')!r}, "
                                 f"not {tee!r}", param_hint="--manifest")
    return pinned


def pinned_from_manifest(tee: str, manifest: Path, tenant: str | None, model: str | None, version: str | None,
                         package: str | None, policy_admin_key: Path | None, image_env: list[str]) -> PinnedWorker:
    """The version's worker Deployment as the controller creates it from this manifest (a
    confidential overlay whose workers run on `tee`)."""
    import yaml

    from api.orchestrator.kube import TEMPLATE, policy_configmap, worker_deployment
    from api.orchestrator.spec import VersionSpec

    if not (tenant and model and version and package):
        raise typer.BadParameter("with --manifest give --tenant, --model, --version and --package")
    objects = [o for o in yaml.safe_load_all(manifest.read_text()) if isinstance(o, dict)]
    templates = [o for o in objects if o.get("kind") == "Deployment" and o["metadata"]["name"] == TEMPLATE]
    if len(templates) != 1:
        raise typer.BadParameter(f"{manifest}: expected one {TEMPLATE} Deployment", param_hint="--manifest")
    if not is_confidential(templates[0]["spec"]["template"]):
        raise typer.BadParameter(f"{manifest}: the worker template has no CoCo init-data annotation: "
                                 "not a confidential overlay", param_hint="--manifest")
    configmaps = {o["metadata"]["name"]: o.get("data") or {} for o in objects if o.get("kind") == "ConfigMap"}
    spec = VersionSpec(tenant=tenant, model=model, version=version, package=package)
    admin_key = policy_admin_key.read_bytes() if policy_admin_key else None
    cm = None
    if admin_key is not None:  # the controller mounts the tenant's policy set from this ConfigMap
        cm = policy_configmap(spec, {"document": {}, "admin_key_pem": admin_key.decode()}, None)["metadata"]["name"]
    deployment = worker_deployment(templates[0], spec, cm)
    env = _image_env(image_env)
    try:
        from api.orchestrator.pin import pin

        pinned = pin(deployment, configmaps, admin_key, env)
    except PinError as exc:
        raise typer.BadParameter(str(exc), param_hint="--manifest") from None
    if pinned.workload.measured_config.get("tee") != tee:
        raise typer.BadParameter(f"the overlay's workers run on {pinned.workload.measured_config.get('tee')!r}, "
                                 f"not {tee!r}", param_hint="--manifest")
    return pinned


def workload_values(pinned: PinnedWorker | PinnedBroker, tee: str) -> dict[str, Any]:
    """What a relying party allows for this worker (or broker), and what the host launches it with."""
    field = {"snp": "host_data", "tdx": "mr_config_id"}[tee]
    document = pinned.workload if isinstance(pinned, PinnedWorker) else pinned.broker
    return {
        # Worker: release and client policies' allowed_workload_ids. Broker: --broker-workload-id,
        # BROKER_WORKLOAD_ID in sealed-config, a client's broker.workload_ids.
        field: pinned.coco.digest_for(tee).hex(),
        "role": "worker" if isinstance(pinned, PinnedWorker) else "key-broker",
        "init_data_algorithm": pinned.coco.algorithm,
        "agent_policy_sha256": hashlib.sha256(pinned.policy.encode()).hexdigest(),
        "workload": document.to_dict(),
        "init_data_annotation": pinned.coco.annotation(),  # the pod's cc_init_data annotation
    }
