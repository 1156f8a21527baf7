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
* the guest pulling that image only.

It denies exec into a container, reading its output streams, copying files in and replacing the
policy. What it does not cover: the rule set of Kata's genpolicy for mounts, devices, environment,
capabilities and the OCI spec's other fields (the worker checks its own environment and arguments
against the init-data instead), and how many containers with this exact spec the host creates.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
_VAR_REF = re.compile(r"\$\([A-Za-z_][A-Za-z0-9_]*\)")
PAUSE_ARGS = ("/pause",)
DENIED = ("ExecProcessRequest", "ReadStreamRequest", "CopyFileRequest", "SetPolicyRequest")
ALLOWED = ("CreateSandboxRequest", "DestroySandboxRequest", "StartContainerRequest", "RemoveContainerRequest",
           "WaitProcessRequest", "SignalProcessRequest", "StatsContainerRequest", "GetOOMEventRequest",
           "GuestDetailsRequest", "UpdateInterfaceRequest", "UpdateRoutesRequest", "ListInterfacesRequest",
           "ListRoutesRequest", "AddARPNeighborsRequest", "OnlineCPUMemRequest", "CloseStdinRequest",
           "TtyWinResizeRequest", "SetGuestDateTimeRequest", "ReseedRandomDevRequest", "MemHotplugByProbeRequest",
           "RemoveStaleVirtiofsShareMountsRequest", "UpdateEphemeralMountsRequest", "GetMetricsRequest")


class AgentPolicyError(ValueError):
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


def render(pod_spec: Mapping[str, Any]) -> str:
    """The agent policy (Rego) for the pod spec's worker container."""
    container = worker_container(pod_spec)
    allowed = {"name": container["name"], "image": container["image"],
               "command": list(container.get("command", [])), "args": list(container.get("args", []))}
    lines = ["package agent_policy", "", "import future.keywords.if", "",
             f"worker := {json.dumps(allowed, sort_keys=True)}", f"pause_args := {json.dumps(list(PAUSE_ARGS))}", ""]
    lines += [f"default {name} := true" for name in ALLOWED]
    lines += [f"default {name} := false" for name in (*DENIED, "CreateContainerRequest", "PullImageRequest")]
    lines += [
        "",
        "# The sandbox's pause container.",
        "CreateContainerRequest if {",
        '    input.OCI.Annotations["io.kubernetes.cri.container-type"] == "sandbox"',
        "    input.OCI.Process.Args == pause_args",
        "}",
        "",
        "# The worker: its name, its pinned image, exactly its command line.",
        "CreateContainerRequest if {",
        '    input.OCI.Annotations["io.kubernetes.cri.container-type"] == "container"',
        '    input.OCI.Annotations["io.kubernetes.cri.container-name"] == worker.name',
        '    input.OCI.Annotations["io.kubernetes.cri.image-name"] == worker.image',
        "    input.OCI.Process.Args == array.concat(worker.command, worker.args)",
        "}",
        "",
        "PullImageRequest if {",
        "    input.image == worker.image",
        "}",
        "",
    ]
    return "\n".join(lines)


def digest(policy: str) -> str:
    """SHA-256 hex of the policy text: the init-data's `agent_policy_digest`."""
    return hashlib.sha256(policy.encode()).hexdigest()
