"""The Kata agent policy of a worker pod, generated from its pod spec (Confidential Containers).

Inside the confidential VM the Kata agent creates the pod's containers on the host's request and
asks this policy (Rego, package `agent_policy`, one rule per agent API request) before each. The
policy's digest is in the worker's init-data (attestation/initdata.py, `agent_policy_digest`),
whose digest the hardware reports, so a relying party that allows the init-data allows exactly
this policy. It permits:

* the sandbox's pause container, with the pause image's own arguments;
* one container, named as in the pod spec, from the pinned worker image (`name@sha256:...`),
  with exactly the spec's command and arguments (Kubernetes' `$(VAR)` references expanded by the
  kubelet are not accepted: every value must be literal);
* the guest pulling that image only;
* the host copying files into the guest's shared directory only (no `..`): that is how Kata hands
  a confidential guest the pod's ConfigMap, Secret and downward-API volumes (the worker's init-data
  file among them), whose contents are the host's anyway and checked by the worker where it matters
  (init-data against the hardware digest, the tenant policy by its signature).

The worker's environment must be exactly the image's ENV and the pod's literal values (a variable the
pod takes from the downward API or a Secret, and HOSTNAME and KUBERNETES_*, with any value), and its
mounts go only where the pod spec and the runtime put them. It denies exec into a container, reading
its output streams and replacing the policy. What it does not cover: the rest of Kata genpolicy's
rules (mount sources, types and options, storages, devices, capabilities, user, the OCI spec's other
fields), and how many containers with this exact spec the host creates.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from api.errors import SealedApiError

_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
_VAR_REF = re.compile(r"\$\([A-Za-z_][A-Za-z0-9_]*\)")
PAUSE_ARGS = ("/pause",)
# The worker image's ENTRYPOINT (deploy/docker/Dockerfile.worker); a pod states it as its `command`.
WORKER_ENTRYPOINT = ("python", "-m", "enclave_worker.grpc_server")
DENIED = ("ExecProcessRequest", "ReadStreamRequest", "SetPolicyRequest")
# What the runtime adds to every container: the kernel file systems, the pod's name files, and the
# variables Kubernetes always sets (HOSTNAME; the API server's KUBERNETES_SERVICE_* and *_PORT_*).
RUNTIME_MOUNTS = ("/proc", "/dev", "/dev/pts", "/dev/mqueue", "/dev/shm", "/sys", "/sys/fs/cgroup", "/etc/hosts",
                  "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log")
RUNTIME_ENV = ("HOSTNAME=", "KUBERNETES_")
SHARED_DIR = "/run/kata-containers/shared/containers/"  # where Kata copies the pod's volumes into the guest
ALLOWED = ("CreateSandboxRequest", "DestroySandboxRequest", "StartContainerRequest", "RemoveContainerRequest",
           "WaitProcessRequest", "SignalProcessRequest", "StatsContainerRequest", "GetOOMEventRequest",
           "GuestDetailsRequest", "UpdateInterfaceRequest", "UpdateRoutesRequest", "ListInterfacesRequest",
           "ListRoutesRequest", "AddARPNeighborsRequest", "OnlineCPUMemRequest", "CloseStdinRequest",
           "TtyWinResizeRequest", "SetGuestDateTimeRequest", "ReseedRandomDevRequest", "MemHotplugByProbeRequest",
           "RemoveStaleVirtiofsShareMountsRequest", "UpdateEphemeralMountsRequest", "GetMetricsRequest")


class AgentPolicyError(SealedApiError, ValueError):
    """The pod spec cannot be pinned: not exactly one container, an unpinned image, a `$(VAR)`."""


def worker_container(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's one container, pinned and literal; raises AgentPolicyError otherwise."""
    for extra in ("initContainers", "ephemeralContainers"):
        if pod_spec.get(extra):
            raise AgentPolicyError(f"a worker pod has no {extra}")
    containers = pod_spec.get("containers") or []
    if len(containers) != 1:
        raise AgentPolicyError(f"a worker pod has exactly one container, not {len(containers)}")
    container = dict(containers[0])
    image = str(container.get("image", ""))
    if not _PINNED.match(image):
        raise AgentPolicyError(f"the worker image must be pinned by digest: {image!r}")
    argv = [*container.get("command", []), *container.get("args", [])]
    if any(_VAR_REF.search(str(a)) for a in argv):
        raise AgentPolicyError("the worker's arguments must be literal (no $(VAR) references)")
    return container


def _environment(container: Mapping[str, Any], image_env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The worker's environment as the runtime builds it: the image's ENV under the pod's literal
    values (exact `NAME=VALUE` strings), and the prefixes of the per-pod ones (any value)."""
    literal = {**image_env, **{str(e["name"]): str(e["value"]) for e in container.get("env", []) if "value" in e}}
    per_pod = {f"{e['name']}=" for e in container.get("env", []) if "value" not in e}
    return sorted(f"{k}={v}" for k, v in literal.items()), sorted(per_pod | set(RUNTIME_ENV))


def render(pod_spec: Mapping[str, Any], image_env: Mapping[str, str] | None = None) -> str:
    """The agent policy (Rego) for the pod spec's worker container; `image_env` is the image's own
    ENV (`docker image inspect`), which the runtime puts under the pod's."""
    container = worker_container(pod_spec)
    env, per_pod = _environment(container, image_env or {})
    mounts = sorted({*RUNTIME_MOUNTS, *(str(m["mountPath"]) for m in container.get("volumeMounts", []))})
    allowed = {"name": container["name"], "image": container["image"], "command": list(container.get("command", [])),
               "args": list(container.get("args", [])), "env": env, "mounts": mounts}
    lines = ["package agent_policy", "", "import future.keywords.every", "import future.keywords.if",
             "import future.keywords.in", "", f"worker := {json.dumps(allowed, sort_keys=True)}",
             f"pause_args := {json.dumps(list(PAUSE_ARGS))}", f"per_pod_env := {json.dumps(per_pod)}", ""]
    lines += [f"default {name} := true" for name in ALLOWED]
    lines += [f"default {name} := false" for name in (*DENIED, "CreateContainerRequest", "PullImageRequest",
                                                      "CopyFileRequest")]
    lines += [
        "",
        "# The sandbox's pause container.",
        "CreateContainerRequest if {",
        '    input.OCI.Annotations["io.kubernetes.cri.container-type"] == "sandbox"',
        "    input.OCI.Process.Args == pause_args",
        "}",
        "",
        "# The worker: its name, its pinned image, exactly its command line, no environment variable",
        "# but its own (no LD_PRELOAD or PYTHONPATH from the host), mounts only where its pod spec has them.",
        "CreateContainerRequest if {",
        '    input.OCI.Annotations["io.kubernetes.cri.container-type"] == "container"',
        '    input.OCI.Annotations["io.kubernetes.cri.container-name"] == worker.name',
        '    input.OCI.Annotations["io.kubernetes.cri.image-name"] == worker.image',
        "    input.OCI.Process.Args == array.concat(worker.command, worker.args)",
        "    every e in input.OCI.Process.Env { allowed_env(e) }",
        "    every m in input.OCI.Mounts { m.destination in worker.mounts }",
        "}",
        "",
        "allowed_env(e) if {",
        "    e in worker.env",
        "}",
        "",
        "allowed_env(e) if {",
        "    some prefix in per_pod_env",
        "    startswith(e, prefix)",
        "}",
        "",
        "PullImageRequest if {",
        "    input.image == worker.image",
        "}",
        "",
        "# The pod's volumes, into the shared directory and nowhere else.",
        "CopyFileRequest if {",
        f"    startswith(input.path, {json.dumps(SHARED_DIR)})",
        '    not contains(input.path, "..")',
        "}",
        "",
    ]
    return "\n".join(lines)


def digest(policy: str) -> str:
    """SHA-256 hex of the policy text: the init-data's `agent_policy_digest`."""
    return hashlib.sha256(policy.encode()).hexdigest()
