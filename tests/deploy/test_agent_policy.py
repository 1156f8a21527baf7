"""The generated Kata agent policy (api/orchestrator/agent_policy.py): only the pinned worker image
with exactly its arguments, the sandbox's pause container, no exec, no second container.

No Rego engine (OPA, regorus) is installed here, so the rules are evaluated by the small
interpreter below, which reads the generated text itself: each `NAME if { ... }` block is a
conjunction of `input.<path> == <value>` lines, `default NAME := bool` the fallback, as in the
Kata agent's policy semantics (a request is allowed when its rule evaluates to true).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.orchestrator.agent_policy import AgentPolicyError, digest, render

IMAGE = "registry.sealed.example/sealed-worker@sha256:" + "ab" * 32
ARGS = ["--broker-url", "https://broker.example", "--tee", "snp", "--tenant", "acme"]
TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base" / "worker-template.yaml"


def pod(**container: Any) -> dict[str, Any]:
    return {"containers": [{"name": "worker", "image": IMAGE, "args": ARGS, **container}]}


def evaluate(policy: str, request: str, inp: dict[str, Any]) -> bool:
    """The value of rule `request` for `inp`: true if one of its bodies holds, else its default."""
    values = dict(re.findall(r"^(\w+) := (.+)$", policy, re.M))
    default = re.search(rf"^default {request} := (true|false)$", policy, re.M)
    assert default is not None, f"{request} has no default: the agent would fail closed on an undefined rule"

    def value(expr: str) -> Any:
        if expr.startswith("array.concat("):
            a, b = expr[len("array.concat("):-1].split(", ")
            return value(a) + value(b)
        head, _, attr = expr.partition(".")
        if head in values:
            base = json.loads(values[head])
            return base[attr] if attr else base
        return json.loads(expr)

    def lookup(path: str) -> Any:
        node: Any = inp
        for part in re.findall(r'\.(\w+)|\["([^"]+)"\]', path):
            node = node.get(part[0] or part[1]) if isinstance(node, dict) else None
        return node

    for body in re.findall(rf"^{request} if {{\n(.*?)\n}}", policy, re.M | re.S):
        conditions = [line.strip().split(" == ", 1) for line in body.splitlines()]
        if all(lookup(lhs[len("input"):]) == value(rhs) for lhs, rhs in conditions):
            return True
    return default.group(1) == "true"


def create(kind: str, args: list[str], *, name: str = "worker", image: str = IMAGE) -> dict[str, Any]:
    return {"OCI": {"Process": {"Args": args}, "Annotations": {
        "io.kubernetes.cri.container-type": kind, "io.kubernetes.cri.container-name": name,
        "io.kubernetes.cri.image-name": image}}}


POLICY = render(pod())


def test_the_pinned_worker_and_the_pause_container_are_created() -> None:
    assert evaluate(POLICY, "CreateContainerRequest", create("container", ARGS))
    assert evaluate(POLICY, "CreateContainerRequest", create("sandbox", ["/pause"], name="", image=""))
    assert evaluate(POLICY, "PullImageRequest", {"image": IMAGE})


@pytest.mark.parametrize(("name", "request_", "inp"), [
    ("another-image", "CreateContainerRequest", create("container", ARGS, image=IMAGE.replace("ab", "cd"))),
    ("one-changed-argument", "CreateContainerRequest", create("container", [*ARGS[:-1], "other"])),
    ("an-added-argument", "CreateContainerRequest", create("container", [*ARGS, "--unsafe-no-tenant-policy"])),
    ("a-second-container", "CreateContainerRequest", create("container", ["sh"], name="sidecar")),
    ("a-sandbox-running-a-shell", "CreateContainerRequest", create("sandbox", ["/bin/sh"], name="", image="")),
    ("pull-another-image", "PullImageRequest", {"image": "busybox@sha256:" + "00" * 32}),
    ("exec", "ExecProcessRequest", {"process": {"Args": ["sh"]}}),
    ("read-output", "ReadStreamRequest", {}),
    ("copy-a-file-in", "CopyFileRequest", {"path": "/etc/sealed/init-data.json"}),
    ("replace-the-policy", "SetPolicyRequest", {"policy": "package agent_policy"}),
])
def test_refused(name: str, request_: str, inp: dict[str, Any]) -> None:
    assert not evaluate(POLICY, request_, inp)


@pytest.mark.parametrize(("spec", "message"), [
    (pod(image="sealed-worker:latest"), "pinned by digest"),
    ({"containers": [pod()["containers"][0], {"name": "sidecar", "image": IMAGE}]}, "exactly one container"),
    ({**pod(), "initContainers": [{"name": "init", "image": IMAGE}]}, "initContainers"),
    (pod(args=["--broker-url", "$(BROKER_URL)"]), "literal"),
])
def test_a_pod_spec_that_cannot_be_pinned_is_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(AgentPolicyError, match=re.escape(message)):
        render(spec)


def test_the_repository_template_must_be_pinned_per_version_first() -> None:
    """The base template names `sealed-worker` (a tag) and `$(BROKER_URL)`: what the worker runs is
    known only once the image is pinned and the values are literal, per model version."""
    spec = yaml.safe_load(TEMPLATE.read_text())["spec"]["template"]["spec"]
    with pytest.raises(AgentPolicyError):
        render(spec)


def test_the_digest_names_the_document() -> None:
    assert digest(POLICY) == digest(render(pod()))
    assert digest(POLICY) != digest(render(pod(args=[*ARGS, "--max-num-seqs", "8"])))
