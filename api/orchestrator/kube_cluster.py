"""The controller's calls into the Kubernetes API server (`kube.Cluster`), with the official client:
apps/v1 Deployments, v1 ConfigMaps and keda.sh/v1alpha1 ScaledObjects. No API server runs in the
tests here (docs/deploy.md, "The controller: what the tests cover")."""

from __future__ import annotations

import logging
from typing import Any, cast

log = logging.getLogger(__name__)


class KubeCluster:
    """The official `kubernetes` client: apps/v1 Deployments, v1 ConfigMaps, keda.sh ScaledObjects."""

    def __init__(self, namespace: str, template: str) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.namespace, self.template_name = namespace, template
        self.api = client.ApiClient()
        self.apps, self.core, self.custom = client.AppsV1Api(), client.CoreV1Api(), client.CustomObjectsApi()
        self._exc = client.ApiException

    def template(self) -> dict[str, Any]:
        obj = self.apps.read_namespaced_deployment(self.template_name, self.namespace)
        return dict(self.api.sanitize_for_serialization(obj))

    def configmaps(self) -> dict[str, dict[str, str]]:
        """The namespace's ConfigMaps (name -> data): the values a pinned worker pod is written with."""
        return {c.metadata.name: dict(c.data or {}) for c in self.core.list_namespaced_config_map(self.namespace).items
                if c.metadata is not None and c.metadata.name is not None}

    def managed(self) -> set[tuple[str, str]]:
        selector = "app.kubernetes.io/managed-by=sealed-controller"
        # The API server names every object it lists; the client's models make metadata optional.
        found = {("Deployment", d.metadata.name) for d in
                 self.apps.list_namespaced_deployment(self.namespace, label_selector=selector).items
                 if d.metadata is not None and d.metadata.name is not None}
        found |= {("ConfigMap", c.metadata.name) for c in
                  self.core.list_namespaced_config_map(self.namespace, label_selector=selector).items
                  if c.metadata is not None and c.metadata.name is not None}
        # Custom objects come back as the decoded JSON (the client types them `object`).
        scaled = cast("dict[str, Any]", self.custom.list_namespaced_custom_object(
            "keda.sh", "v1alpha1", self.namespace, "scaledobjects", label_selector=selector))
        found |= {("ScaledObject", s["metadata"]["name"]) for s in scaled.get("items", [])}
        return found

    def apply(self, obj: dict[str, Any]) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            if kind == "Deployment":
                try:
                    current = self.apps.read_namespaced_deployment(name, self.namespace)
                    # KEDA owns the replica count once the ScaledObject exists.
                    obj = {**obj, "spec": {**obj["spec"], "replicas": current.spec.replicas}}
                    # The bodies are manifests as dicts: the client's validate_call turns a dict into
                    # the model at call time, but its signatures name only the model class.
                    self.apps.replace_namespaced_deployment(name, self.namespace, obj)  # type: ignore[arg-type]
                except self._exc as exc:
                    if exc.status != 404:
                        raise
                    self.apps.create_namespaced_deployment(self.namespace, obj)  # type: ignore[arg-type]
            elif kind == "ConfigMap":
                try:
                    self.core.replace_namespaced_config_map(name, self.namespace, obj)  # type: ignore[arg-type]
                except self._exc as exc:
                    if exc.status != 404:
                        raise
                    self.core.create_namespaced_config_map(self.namespace, obj)  # type: ignore[arg-type]
            else:
                args = ("keda.sh", "v1alpha1", self.namespace, "scaledobjects")
                try:
                    live = cast("dict[str, Any]", self.custom.get_namespaced_custom_object(*args, name))
                    obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                    self.custom.replace_namespaced_custom_object(*args, name, obj)
                except self._exc as exc:
                    if exc.status != 404:
                        raise
                    self.custom.create_namespaced_custom_object(*args, obj)
        except self._exc as exc:
            log.warning("could not apply %s %s: %s", kind, name, exc.status)

    def delete(self, kind: str, name: str) -> None:
        try:
            if kind == "Deployment":
                self.apps.delete_namespaced_deployment(name, self.namespace)
            elif kind == "ConfigMap":
                self.core.delete_namespaced_config_map(name, self.namespace)
            else:
                self.custom.delete_namespaced_custom_object("keda.sh", "v1alpha1", self.namespace, "scaledobjects",
                                                            name)
        except self._exc as exc:
            if exc.status != 404:
                log.warning("could not delete %s %s: %s", kind, name, exc.status)
