"""The key broker's pod pinned: the CoCo init-data it launches with, from a rendered overlay.

A worker pod is pinned per model version by the controller (pin.py); the broker is one static
Deployment the operator applies, so its init-data is computed once from the rendered overlay
(`sealed measure snp|tdx --manifest ... --broker`) and set as its pod's annotation. As for a worker:

1. every environment value comes from the ConfigMaps or is literal, except the operator's
   credentials (attestation/launch_env.BROKER_UNMEASURED_ENV), which stay Secret references;
2. the kubelet's `$(VAR)` references in the arguments are expanded as the kubelet would;
3. the Kata agent policy is generated from that pod spec (agent_policy.py: one container, the pinned
   image, exactly its command line, its environment, no exec, no second container), the broker's
   document from the broker's own argument parser and settings
   (key_broker/workload_check.broker_init_data_for), and the CoCo TOML carrying both.

The broker reads the annotation back through a downward-API file (`--init-data`, in the overlay) and
refuses to start unless it runs what the document says and its hardware reports its digest.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.orchestrator.agent_policy import AgentPolicyError, digest, render
from api.orchestrator.pin import IMAGE_ENV_ANNOTATION, PinError, expand_refs, resolve_env
from attestation.broker_initdata import BrokerInitData
from attestation.coco_initdata import ANNOTATION, CocoInitData
from attestation.coco_initdata import render as render_coco
from attestation.errors import AttestationError
from attestation.launch_env import BROKER_UNMEASURED_ENV

BROKER = "sealed-broker"
BROKER_ENTRYPOINT = ("python", "-m", "key_broker")  # deploy/docker/Dockerfile.broker's ENTRYPOINT


@dataclass(frozen=True)
class PinnedBroker:
    deployment: dict[str, Any]  # the broker Deployment, its init-data annotation set
    broker: BrokerInitData
    coco: CocoInitData
    policy: str  # the Kata agent policy (Rego)
    argv: tuple[str, ...]  # the broker's literal arguments
    environ: dict[str, str]  # its literal environment (image ENV under the pod's env)


def _image_env(deployment: Mapping[str, Any]) -> dict[str, str]:
    raw = (deployment.get("metadata", {}).get("annotations") or {}).get(IMAGE_ENV_ANNOTATION, "{}")
    try:
        env = json.loads(raw)
    except ValueError as exc:
        raise PinError(f"{IMAGE_ENV_ANNOTATION} of the broker is not JSON: {exc}") from None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise PinError(f"{IMAGE_ENV_ANNOTATION} must map names to strings")
    return env


def pin_broker(deployment: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]],
               image_env: Mapping[str, str] | None = None) -> PinnedBroker:
    """The broker Deployment with the CoCo init-data of exactly what it runs."""
    from key_broker.__main__ import parse, settings_from
    from key_broker.errors import SettingsError
    from key_broker.workload_check import broker_init_data_for

    out = copy.deepcopy(dict(deployment))
    pod = out["spec"]["template"]
    container = next((c for c in pod["spec"].get("containers", []) if c.get("name") == "broker"), None)
    if container is None:
        raise PinError("the broker pod has no container named broker")
    if tuple(container.get("command") or ()) != BROKER_ENTRYPOINT:
        raise PinError(f"the broker's command must state the image's entrypoint {list(BROKER_ENTRYPOINT)}")
    env = resolve_env(container.get("env", []), configmaps, BROKER_UNMEASURED_ENV, " of the broker")
    values = {e["name"]: e["value"] for e in env if "value" in e}
    argv = [expand_refs(str(a), values) for a in container.get("args", [])]
    if "--init-data" not in argv:
        raise PinError("the broker's arguments must name its init-data file (--init-data, a downward-API file)")
    literal = {**copy.deepcopy(pod["spec"]), "containers": [{**container, "env": env, "args": argv}]}
    image = dict(image_env) if image_env is not None else _image_env(deployment)
    environ = {**image, **values}
    try:
        policy = render(literal, image)
        args = parse(argv)
    except SystemExit:
        raise PinError("the broker refuses these arguments (its usage error is above)") from None
    except AgentPolicyError as exc:
        raise PinError(str(exc)) from None
    try:  # the operator's credentials are never read here: a stand-in satisfies the settings' checks
        settings = settings_from(args, {"SEALED_VAULT_TOKEN": secrets.token_urlsafe(32)})
        broker = broker_init_data_for(container["image"], argv, environ, settings, digest(policy))
        coco = render_coco(broker, policy)
    except (SettingsError, AttestationError) as exc:
        raise PinError(str(exc)) from None
    pod.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = coco.annotation()
    return PinnedBroker(out, broker, coco, policy, tuple(argv), environ)


def broker_from_objects(objects: list[dict[str, Any]], image_env: Mapping[str, str] | None = None) -> PinnedBroker:
    """The broker of a rendered overlay (`kubectl kustomize` output), pinned."""
    brokers = [o for o in objects if o.get("kind") == "Deployment" and o["metadata"]["name"] == BROKER]
    if len(brokers) != 1:
        raise PinError(f"expected one {BROKER} Deployment, found {len(brokers)}")
    configmaps = {o["metadata"]["name"]: o.get("data") or {} for o in objects if o.get("kind") == "ConfigMap"}
    return pin_broker(brokers[0], configmaps, image_env)
