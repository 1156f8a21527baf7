"""The control loop as a Kubernetes controller: per model version, a Deployment and a KEDA
ScaledObject (`python -m api.orchestrator.kube`, deployed by deploy/k8s/base/controller.yaml).

Same inputs and decisions as the one-host loop (`GET /admin/v1/deployments`, the broker's data-key
records, `reconcile.decide`); the runtime differs:
- workers: a Deployment cloned from `sealed-worker-template` (whose pod template the overlays make
  confidential: runtime class, init-data, TEE, GPUs), with the version's arguments and labels;
- replicas: a ScaledObject on the gateway's per-version metrics (queue depth plus unserved
  requests), floor `min_warm` (0: scale to zero; a request wakes it), ceiling `max_replicas`;
- crashed workers: the kubelet restarts them (CrashLoopBackOff is the backoff); a worker whose
  key is refused reports "failed" on /internal/readyz and stays unready, and /readyz of the
  gateway names the version and the reason;
- retired or deleted versions: both objects are deleted (the pods drain for
  terminationGracePeriodSeconds).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from api.orchestrator.pin import IMAGE_ENV_ANNOTATION, PinError, is_confidential, pin
from api.orchestrator.reconcile import History, Inputs, decide
from api.orchestrator.spec import VersionSpec
from protocol.model_ref import ModelRef

log = logging.getLogger(__name__)
TEMPLATE = "sealed-worker-template"
PACKAGES_MOUNT = "/var/lib/sealed/packages"
MANAGED_BY = {"app.kubernetes.io/managed-by": "sealed-controller"}
TARGET_QUEUE = 4  # requests per worker, as the one-host loop's ScalingPolicy


def version_id(spec: VersionSpec) -> str:
    return hashlib.sha256(f"{spec.tenant}\0{spec.model}\0{spec.version}".encode()).hexdigest()[:10]


def _label(value: str) -> str:
    """A label-safe rendering (63 characters, alphanumerics and -_.); the full names are annotations."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:63].strip("-_.") or "x"


def object_name(spec: VersionSpec) -> str:
    slug = re.sub(r"[^a-z0-9-]", "-", f"{spec.tenant}-{spec.model}-{spec.version}".lower())
    return f"sealed-worker-{slug[:30].strip('-')}-{version_id(spec)}"


def _prom(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def queue_query(spec: VersionSpec) -> str:
    """The version's load as KEDA reads it from the gateways' metrics (summed over replicas)."""
    t, m, v = _prom(spec.tenant), _prom(spec.model), _prom(spec.version)
    return (f'sum(sealed:model_queue_depth{{tenant="{t}",model_name="{m}",version="{v}"}} or vector(0)) + '
            f'sum(sealed:model_unserved_requests{{tenant="{t}",model_name="{m}"}} or vector(0))')


def worker_deployment(template: dict[str, Any], spec: VersionSpec, policy_configmap: str | None) -> dict[str, Any]:
    """The version's Deployment: the template's pod (runtime class, init-data, probes, security
    context) with the version's arguments and labels."""
    labels = {"app.kubernetes.io/name": "sealed-worker", "app.kubernetes.io/component": "worker",
              "sealed.dev/version-id": version_id(spec), "sealed.dev/tenant": _label(spec.tenant),
              "sealed.dev/model": _label(spec.model), "sealed.dev/version": _label(spec.version)}
    pod = copy.deepcopy(template["spec"]["template"])
    pod["metadata"]["labels"] = {**{k: v for k, v in pod["metadata"].get("labels", {}).items()
                                    if k != "sealed.dev/template"}, **labels}
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    args = [*container.get("args", []), "--tenant", spec.tenant, "--model", spec.model, "--version", spec.version,
            "--package-dir", f"{PACKAGES_MOUNT}/packages/{spec.package}"]
    if policy_configmap:
        args += ["--policy-file", "/etc/sealed/policy/policy.json",
                 "--policy-admin-key", "/etc/sealed/policy/policy-admin.pub.pem"]
        container.setdefault("volumeMounts", []).append(
            {"name": "tenant-policy", "mountPath": "/etc/sealed/policy", "readOnly": True})
        pod["spec"].setdefault("volumes", []).append(
            {"name": "tenant-policy", "configMap": {"name": policy_configmap}})
    else:
        args.append("--unsafe-no-tenant-policy")  # measured: the release policy must allow exactly this
    container["args"] = args
    # The image's measured ENV travels with the Deployment: pin.py puts it into the init-data.
    image_env = {k: v for k, v in (template["metadata"].get("annotations") or {}).items() if k == IMAGE_ENV_ANNOTATION}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": object_name(spec), "namespace": template["metadata"].get("namespace"),
                     "labels": {**labels, **MANAGED_BY},
                     "annotations": {"sealed.dev/model-version": spec.name, **image_env}},
        "spec": {"replicas": spec.min_warm, "selector": {"matchLabels": {"sealed.dev/version-id": version_id(spec)}},
                 "template": pod},
    }


def scaled_object(spec: VersionSpec, prometheus_url: str, namespace: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": object_name(spec), "namespace": namespace,
                     "labels": {"sealed.dev/version-id": version_id(spec), **MANAGED_BY},
                     "annotations": {"sealed.dev/model-version": spec.name}},
        "spec": {
            "scaleTargetRef": {"name": object_name(spec)},
            "minReplicaCount": spec.min_warm,  # the warm pool; 0 lets the version scale to zero
            "maxReplicaCount": max(spec.max_replicas, spec.min_warm),
            "pollingInterval": 5,
            "cooldownPeriod": 300,  # from the last activity to zero
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleDown": {"stabilizationWindowSeconds": 60,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}}},
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": prometheus_url, "query": queue_query(spec),
                "threshold": str(TARGET_QUEUE), "activationThreshold": "0"}}],
        },
    }


def policy_configmap(spec: VersionSpec, policy: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    import json

    name = f"sealed-policy-{re.sub(r'[^a-z0-9-]', '-', spec.tenant.lower())[:40]}-{version_id(spec)[:6]}"
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
            "data": {"policy.json": json.dumps(policy["document"], sort_keys=True),
                     "policy-admin.pub.pem": str(policy["admin_key_pem"])}}


@dataclass(frozen=True)
class Plan:
    apply: tuple[dict[str, Any], ...]
    delete: tuple[tuple[str, str], ...]  # (kind, name)
    status: tuple[tuple[VersionSpec, str, str], ...]  # (version, status, reason) for /readyz


def plan(specs: list[VersionSpec], template: dict[str, Any], existing: set[tuple[str, str]],
         inputs: dict[ModelRef, Inputs], policies: dict[str, dict[str, Any] | None],
         prometheus_url: str, now: float, history: dict[ModelRef, History] | None = None,
         configmaps: Mapping[str, Mapping[str, str]] | None = None) -> Plan:
    """Pure: what to create or update, what to delete, and what to report. A confidential
    template's workers are pinned per version with their own CoCo init-data (pin.py), from the
    namespace's `configmaps`; a version whose pod cannot be pinned gets nothing and says why."""
    namespace = template["metadata"].get("namespace")
    history = history if history is not None else {}
    apply: list[dict[str, Any]] = []
    wanted: set[tuple[str, str]] = set()
    status = []
    for spec in specs:
        decision = decide(spec, inputs.get(spec.key, Inputs(False, False)), 0, history.setdefault(spec.key, History()),
                          now)
        status.append((spec, decision.status if decision.status != "cold" else "", decision.reason
                       if decision.status not in ("", "cold") else ""))
        runnable = not spec.retired and decision.status in ("", "cold", "failing")
        if not runnable:
            continue
        policy = policies.get(spec.tenant)
        configmap = None
        if policy and policy.get("admin_key_pem") and policy.get("document"):
            configmap = policy_configmap(spec, policy, namespace)
        deployment = worker_deployment(template, spec, configmap["metadata"]["name"] if configmap else None)
        if is_confidential(deployment["spec"]["template"]):
            try:
                admin_key = str(policy["admin_key_pem"]).encode() if configmap and policy else None
                deployment = pin(deployment, configmaps or {}, admin_key).deployment
            except PinError as exc:
                status[-1] = (spec, "failing", f"the worker pod cannot be pinned: {exc}")
                continue
        if configmap is not None:
            apply.append(configmap)
            wanted.add(("ConfigMap", configmap["metadata"]["name"]))
        apply += [deployment, scaled_object(spec, prometheus_url, namespace)]
        wanted |= {("Deployment", object_name(spec)), ("ScaledObject", object_name(spec))}
    delete = tuple(sorted(existing - wanted))
    return Plan(tuple(apply), delete, tuple(status))


class Cluster(Protocol):
    """What the controller needs from the API server (KubeCluster wraps the official client)."""

    def template(self) -> dict[str, Any]: ...
    def managed(self) -> set[tuple[str, str]]: ...
    def configmaps(self) -> dict[str, dict[str, str]]: ...
    def apply(self, obj: dict[str, Any]) -> None: ...
    def delete(self, kind: str, name: str) -> None: ...


class KubeController:
    """One reconcile step every `interval_s`: the same HTTP inputs as the one-host loop."""

    def __init__(self, cluster: Cluster, source: Any, prometheus_url: str) -> None:
        self.cluster, self.source, self.prometheus_url = cluster, source, prometheus_url
        self.history: dict[ModelRef, History] = {}
        self.reported: dict[ModelRef, tuple[str, str]] = {}

    def step(self, now: float | None = None) -> Plan:
        specs = [VersionSpec.from_api(d) for d in self.source.deployments()]
        inputs, policies = {}, {}
        for spec in specs:
            broker = self.source.broker_tenant(spec.tenant) or {}
            records = {(d["model"], d["version"]) for d in broker.get("data_keys", [])}
            inputs[spec.key] = Inputs(package=spec.package is not None, data_key=(spec.model, spec.version) in records,
                                      key_revoked=bool(broker.get("revoked")))
            if spec.tenant not in policies:
                policies[spec.tenant] = self.source.tenant_policy(spec.tenant)
        result = plan(specs, self.cluster.template(), self.cluster.managed(), inputs, policies, self.prometheus_url,
                      time.monotonic() if now is None else now, self.history, self.cluster.configmaps())
        for obj in result.apply:
            self.cluster.apply(obj)
        for kind, name in result.delete:
            self.cluster.delete(kind, name)
        for spec, status, reason in result.status:
            if self.reported.get(spec.key) != (status, reason):
                self.source.report(spec, status, reason)
                self.reported[spec.key] = (status, reason)
        return result


class HttpSource:
    """The gateway's management API and the broker's admin API, as the one-host loop reads them."""

    def __init__(self, gateway_url: str, broker_url: str, jwt_secret_file: Path, broker_token_file: Path) -> None:
        self.gateway_url, self.broker_url = gateway_url.rstrip("/"), broker_url.rstrip("/")
        self.jwt_secret_file, self.broker_token_file = jwt_secret_file, broker_token_file

    def _gateway(self, method: str, path: str, body: Any = None) -> Any:
        import httpx

        from api.management.auth import issue_token

        token = issue_token(self.jwt_secret_file.read_text().strip(), "kube-controller", "operator", ttl_s=300)
        r = httpx.request(method, f"{self.gateway_url}/admin/v1{path}", json=body, timeout=10.0,
                          headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()
        return r.json()

    def deployments(self) -> list[dict[str, Any]]:
        return list(self._gateway("GET", "/deployments")["data"])

    def broker_tenant(self, tenant: str) -> dict[str, Any] | None:
        import httpx

        r = httpx.get(f"{self.broker_url}/v1/admin/tenants/{tenant}", timeout=10.0,
                      headers={"Authorization": f"Bearer {self.broker_token_file.read_text().strip()}"})
        return r.json() if r.status_code == 200 else None

    def tenant_policy(self, tenant: str) -> dict[str, Any] | None:
        import httpx

        try:
            return dict(self._gateway("GET", f"/tenants/{tenant}/policy"))
        except httpx.HTTPStatusError:
            return None

    def report(self, spec: VersionSpec, status: str, reason: str) -> None:
        self._gateway("PUT", f"/deployments/{spec.tenant}/{spec.model}/{spec.version}/status",
                      {"status": status, "reason": reason})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.orchestrator.kube")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--gateway-url", required=True)
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--prometheus-url", required=True)
    parser.add_argument("--jwt-secret-file", type=Path, required=True)
    parser.add_argument("--broker-token-file", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(levelname)s %(message)s")
    from api.orchestrator.kube_cluster import KubeCluster

    controller = KubeController(KubeCluster(args.namespace, TEMPLATE),
                                HttpSource(args.gateway_url, args.broker_url, args.jwt_secret_file,
                                           args.broker_token_file), args.prometheus_url)
    while True:
        try:
            controller.step()
        except Exception as exc:  # the gateway, broker or API server restarting: try again
            log.warning("reconcile failed: %s", type(exc).__name__)
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
