"""The generated Kata agent policy (api/orchestrator/agent_policy.py): only the pinned worker image
with exactly its arguments, the sandbox's pause container, no exec, no second container.

No Rego engine (OPA, regorus) is installed here: the generated text is evaluated by
tests/deploy/rego_subset.py, which knows exactly the forms the generator writes, with the Kata
agent's semantics (docs/deploy.md says what that leaves untested).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.orchestrator.agent_policy import AgentPolicyError, digest, render

from .rego_subset import evaluate

IMAGE = "registry.sealed.example/sealed-worker@sha256:" + "ab" * 32
ARGS = ["--broker-url", "https://broker.example", "--tee", "snp", "--tenant", "acme"]
TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base" / "worker-template.yaml"


def pod(**container: Any) -> dict[str, Any]:
    return {"containers": [{"name": "worker", "image": IMAGE, "args": ARGS, **container}]}


RUNTIME_ENV = ["HOSTNAME=worker-7d9f", "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_PORT_443_TCP_PORT=443"]
RUNTIME_MOUNTS = [{"destination": d, "source": "x", "type_": "bind"} for d in ("/proc", "/dev", "/etc/hosts")]


def create(kind: str, args: list[str], *, name: str = "worker", image: str = IMAGE, env: list[str] | None = None,
           mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A CreateContainerRequest as the Kata agent hands it to the policy (the fields the rules read)."""
    return {"OCI": {"Process": {"Args": args, "Env": RUNTIME_ENV if env is None else env},
                    "Mounts": RUNTIME_MOUNTS if mounts is None else mounts,
                    "Annotations": {"io.kubernetes.cri.container-type": kind, "io.kubernetes.cri.container-name": name,
                                    "io.kubernetes.cri.image-name": image}}}


POLICY = render(pod())
SHARED = "/run/kata-containers/shared/containers/"


def test_the_pinned_worker_and_the_pause_container_are_created() -> None:
    assert evaluate(POLICY, "CreateContainerRequest", create("container", ARGS))
    assert evaluate(POLICY, "CreateContainerRequest", create("sandbox", ["/pause"], name="", image=""))
    assert evaluate(POLICY, "PullImageRequest", {"image": IMAGE})
    # How Kata hands a confidential guest the pod's volumes (the init-data file among them).
    assert evaluate(POLICY, "CopyFileRequest", {"path": SHARED + "abc-123-init-data/cc_init_data"})


@pytest.mark.parametrize(("name", "request_", "inp"), [
    ("another-image", "CreateContainerRequest", create("container", ARGS, image=IMAGE.replace("ab", "cd"))),
    ("one-changed-argument", "CreateContainerRequest", create("container", [*ARGS[:-1], "other"])),
    ("an-added-argument", "CreateContainerRequest", create("container", [*ARGS, "--unsafe-no-tenant-policy"])),
    ("a-second-container", "CreateContainerRequest", create("container", ["sh"], name="sidecar")),
    ("ld-preload-from-the-host", "CreateContainerRequest", create("container", ARGS, env=[*RUNTIME_ENV,
                                                                                          "LD_PRELOAD=/tmp/x.so"])),
    ("pythonpath-from-the-host", "CreateContainerRequest", create("container", ARGS, env=["PYTHONPATH=/tmp"])),
    ("a-mount-over-the-code", "CreateContainerRequest", create("container", ARGS, mounts=[
        *RUNTIME_MOUNTS, {"destination": "/opt/sealed", "source": "/run/kata-containers/shared/x", "type_": "bind"}])),
    ("a-sandbox-running-a-shell", "CreateContainerRequest", create("sandbox", ["/bin/sh"], name="", image="")),
    ("pull-another-image", "PullImageRequest", {"image": "busybox@sha256:" + "00" * 32}),
    ("exec", "ExecProcessRequest", {"process": {"Args": ["sh"]}}),
    ("read-output", "ReadStreamRequest", {}),
    ("copy-a-file-elsewhere", "CopyFileRequest", {"path": "/etc/sealed/init-data.json"}),
    ("copy-out-of-the-shared-dir", "CopyFileRequest", {"path": SHARED + "../../../etc/passwd"}),
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


def test_the_images_env_and_the_pods_volumes_are_admitted_exactly() -> None:
    spec = pod(env=[{"name": "SEALED_TEE", "value": "snp"}, {"name": "POD_IP", "valueFrom": {"fieldRef": {}}}],
               volumeMounts=[{"name": "init-data", "mountPath": "/etc/sealed/init-data"}])
    policy = render(spec, {"PATH": "/opt/sealed/bin:/usr/bin", "PYTHONUNBUFFERED": "1"})
    env = [*RUNTIME_ENV, "PATH=/opt/sealed/bin:/usr/bin", "PYTHONUNBUFFERED=1", "SEALED_TEE=snp", "POD_IP=10.1.2.3"]
    mounts = [*RUNTIME_MOUNTS, {"destination": "/etc/sealed/init-data", "source": "y", "type_": "bind"}]
    assert evaluate(policy, "CreateContainerRequest", create("container", ARGS, env=env, mounts=mounts))
    for changed in ("PYTHONUNBUFFERED=0", "SEALED_TEE=tdx", "PATH=/tmp:/usr/bin"):
        name = changed.split("=")[0]
        other = [e for e in env if not e.startswith(name + "=")] + [changed]
        assert not evaluate(policy, "CreateContainerRequest", create("container", ARGS, env=other, mounts=mounts))
