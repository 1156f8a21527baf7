"""A confidential worker pod pinned for one model version, with the CoCo init-data it launches with.

The worker template in deploy/ is written for every version (`$(BROKER_URL)` arguments, values in
the `sealed-config` ConfigMap); a Kata pod's init-data names one exact workload. So for a worker
Deployment (the template plus the version's arguments, kube.worker_deployment) this:

1. resolves every environment value from the ConfigMaps (a value from the downward API or a Secret
   stays only where the worker does not measure the variable: launch_env.MEASURED_ENV_PREFIXES);
2. expands the kubelet's `$(VAR)` references in the arguments, as the kubelet would, so the
   arguments the agent sees are the literal ones the policy names;
3. adds `--init-data`, the file where the downward API writes the pod's own init-data annotation
   (delivered by the host, so untrusted: the worker checks its digest against its hardware report);
4. generates the Kata agent policy from the pod spec (agent_policy.py), the Sealed workload document
   from the worker's own argument parser and settings (workload_check.init_data_for: image, measured
   arguments, measured environment, measured configuration, policy floor, the policy's digest), and
   the CoCo init-data TOML carrying both (attestation/coco_initdata.py), set as the pod annotation.

The controller (kube.py) does this for every version it runs, and `sealed measure snp|tdx --manifest`
does the same offline, so the digests a tenant allows are the ones the pods launch with.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.errors import SealedApiError
from api.orchestrator.agent_policy import WORKER_ENTRYPOINT, AgentPolicyError, digest, render
from attestation.coco_initdata import ANNOTATION, CocoInitData
from attestation.coco_initdata import render as render_coco
from attestation.errors import AttestationError
from attestation.initdata import InitData
from attestation.launch_env import MEASURED_ENV_PREFIXES

INIT_DATA_DIR = "/etc/sealed/init-data"
INIT_DATA_FILE = "cc_init_data"
INIT_DATA_VOLUME = "init-data"
# On the template Deployment: the worker image's own ENV (JSON object; `docker image inspect`), which
# the runtime gives the worker under the pod's env, so part of its measured environment.
IMAGE_ENV_ANNOTATION = "sealed.dev/image-env"
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class PinError(SealedApiError, ValueError):
    """The worker pod cannot be pinned: a value unknown here, an unpinned image, a bad argument."""


@dataclass(frozen=True)
class PinnedWorker:
    deployment: dict[str, Any]  # the Deployment, its pod pinned, its init-data annotation set
    workload: InitData
    coco: CocoInitData
    policy: str  # the Kata agent policy (Rego)
    argv: tuple[str, ...]  # the worker's literal arguments
    environ: dict[str, str]  # the worker's literal environment (image ENV under the pod's env)


def is_confidential(pod_template: Mapping[str, Any]) -> bool:
    """A Kata pod with init-data: the confidential overlays' component puts the annotation there."""
    return ANNOTATION in (pod_template.get("metadata", {}).get("annotations") or {})


def resolve_env(env: list[dict[str, Any]], configmaps: Mapping[str, Mapping[str, str]],
                unmeasured: Collection[str] = (), whose: str = "") -> list[dict[str, Any]]:
    """A container's env with ConfigMap references resolved: a measured variable (attestation/
    launch_env.py; less the role's `unmeasured` secrets) must have a value known when the pod is
    pinned; the rest stay as they are (the pod IP and the like: per pod, not in any argument; the
    broker operator's credentials: Secrets). Shared by the worker's pods and the broker's."""
    out = []
    for item in env:
        name = str(item["name"])
        ref = (item.get("valueFrom") or {}).get("configMapKeyRef")
        if "value" in item:
            out.append({"name": name, "value": str(item["value"])})
        elif ref is not None and ref.get("key") in configmaps.get(ref.get("name"), {}):
            out.append({"name": name, "value": str(configmaps[ref["name"]][ref["key"]])})
        elif name.startswith(MEASURED_ENV_PREFIXES) and name not in unmeasured:
            raise PinError(f"env {name!r}{whose} is measured, so its value must be known when the pod is pinned")
        else:
            out.append(item)
    return out


def expand_refs(arg: str, values: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group(1) not in values:
            raise PinError(f"argument refers to $({match.group(1)}), which has no value known when the pod is pinned")
        return values[match.group(1)]

    return _REF.sub(one, arg)


def _image_env(deployment: Mapping[str, Any]) -> dict[str, str]:
    raw = (deployment.get("metadata", {}).get("annotations") or {}).get(IMAGE_ENV_ANNOTATION, "{}")
    try:
        env = json.loads(raw)
    except ValueError as exc:
        raise PinError(f"{IMAGE_ENV_ANNOTATION} is not JSON: {exc}") from None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise PinError(f"{IMAGE_ENV_ANNOTATION} must map names to strings")
    return env


def _settings(argv: list[str], admin_key_pem: bytes | None, tmp: Path) -> Any:
    """The worker's settings for `argv`, parsed by the worker's own parser; the tenant's policy-admin
    key (hashed into the measured configuration) is read from `admin_key_pem`, not the pod's path."""
    from enclave_worker.cli import parse

    try:
        _, settings = parse(argv)
    except SystemExit:
        raise PinError("the worker refuses these arguments (its usage error is above)") from None
    if settings.policy_admin_key is not None:
        if admin_key_pem is None:
            raise PinError("the worker pins a tenant policy-admin key: give its public key")
        local = tmp / "policy-admin.pub.pem"
        local.write_bytes(admin_key_pem)
        settings = dataclasses.replace(settings, policy_admin_key=local)
    return settings


def pin(deployment: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]],
        admin_key_pem: bytes | None = None, image_env: Mapping[str, str] | None = None) -> PinnedWorker:
    """The worker Deployment pinned, with the CoCo init-data of exactly what it runs."""
    from enclave_worker.workload_check import init_data_for

    out = copy.deepcopy(dict(deployment))
    pod = out["spec"]["template"]
    container = next((c for c in pod["spec"].get("containers", []) if c.get("name") == "worker"), None)
    if container is None:
        raise PinError("the pod has no container named worker")
    if container.get("command") and tuple(container["command"]) != WORKER_ENTRYPOINT:
        raise PinError(f"the worker's command must be the image's entrypoint {list(WORKER_ENTRYPOINT)}")
    container["env"] = resolve_env(container.get("env", []), configmaps)
    values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    argv = [expand_refs(str(a), values) for a in container.get("args", [])]
    container["args"] = [*argv, "--init-data", f"{INIT_DATA_DIR}/{INIT_DATA_FILE}"]
    mounts = container.setdefault("volumeMounts", [])
    if not any(m.get("name") == INIT_DATA_VOLUME for m in mounts):
        mounts.append({"name": INIT_DATA_VOLUME, "mountPath": INIT_DATA_DIR, "readOnly": True})
    volumes = pod["spec"].setdefault("volumes", [])
    if not any(v.get("name") == INIT_DATA_VOLUME for v in volumes):
        volumes.append({"name": INIT_DATA_VOLUME, "downwardAPI": {"items": [
            {"path": INIT_DATA_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION}']"}}]}})
    image = dict(image_env) if image_env is not None else _image_env(deployment)
    environ = {**image, **values}
    try:
        policy = render(pod["spec"], image)
        with tempfile.TemporaryDirectory() as tmp:
            settings = _settings(container["args"], admin_key_pem, Path(tmp))
            workload = init_data_for(container["image"], container["args"], environ, settings, digest(policy))
        coco = render_coco(workload, policy)
    except (AgentPolicyError, AttestationError) as exc:
        raise PinError(str(exc)) from None
    pod.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = coco.annotation()
    return PinnedWorker(out, workload, coco, policy, tuple(container["args"]), environ)
