"""`sealed measure init-data` computes what the fake hardware reports for a worker started from
the same configuration (the fake-TEE harness launches the guest with that worker's init-data), and
the worker accepts the document it writes."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from api.cli.main import build
from api.orchestrator.agent_policy import digest, render
from attestation.initdata import InitData
from attestation.snp.abi import parse_report
from attestation.tdx.abi import parse_quote
from enclave_worker.cli import parse
from enclave_worker.workload_check import check_runs_as_declared, measured_env, process_environ
from sealed_fakes.platform import FakePlatform
from tests.enclave_worker.fake_tee_worker import TEST_IMAGE, launch_init_data

TEMPLATE = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "base" / "worker-template.yaml"
WORKER = ["--broker-url", "https://broker.example", "--package-dir", "/pkg", "--tenant", "acme", "--model", "m",
          "--version", "v1", "--grpc-port", "50051", "--tee", "snp", "--min-policy-version", "2"]


def measure(tmp_path: Path, *extra: str) -> tuple[dict, Path]:
    out = tmp_path / "init-data.json"
    env = [f"--env={k}={v}" for k, v in measured_env(process_environ()).items()]
    result = CliRunner().invoke(build(), ["measure", "init-data", "--image", TEST_IMAGE, *env, "--out", str(out),
                                          *extra, "--", *WORKER])
    assert result.exit_code == 0, result.output
    return json.loads(result.output), out


def test_measure_matches_the_fake_hardware_and_the_worker(tmp_path: Path) -> None:
    printed, out = measure(tmp_path)
    document = InitData.decode(out.read_bytes())
    assert printed["host_data"] == document.host_data().hex()
    # The harness launches the fake guest with the init-data of the worker it starts.
    launched = launch_init_data(None, WORKER)
    platform = FakePlatform.create(tmp_path / "platform", gpus=1, now=dt.datetime.now(dt.UTC))
    snp = parse_report(platform.snp_report(bytes(64), host_data=launched.host_data()))
    tdx = parse_quote(platform.tdx_quote(bytes(64), mr_config_id=launched.mr_config_id()))
    assert snp.host_data.hex() == printed["host_data"]
    assert tdx.body.mr_config_id.hex() == printed["mr_config_id"]
    # And the worker started so accepts the document as its own.
    check_runs_as_declared(document, WORKER, process_environ(), parse(WORKER)[1])


def test_the_agent_policy_is_part_of_the_identity(tmp_path: Path) -> None:
    policy = tmp_path / "policy.rego"
    policy.write_text("package agent_policy\n")
    without, _ = measure(tmp_path)
    with_policy, _ = measure(tmp_path, "--agent-policy", str(policy))
    assert with_policy["host_data"] != without["host_data"]


@pytest.mark.parametrize(("args", "message"), [
    (["--image", "sealed-worker:latest"], "pinned by digest"),
    (["--image", TEST_IMAGE, "--env", "NOEQUALS"], "NAME=VALUE"),
])
def test_bad_input_is_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(build(), ["measure", "init-data", *args, "--", *WORKER])
    assert result.exit_code != 0 and message in result.output, result.output


def worker_deployment(tmp_path: Path, **container: object) -> Path:
    """The base worker template as the controller pins it for one model version: image by digest,
    literal arguments and environment."""
    doc = yaml.safe_load(TEMPLATE.read_text())
    spec = doc["spec"]["template"]["spec"]
    spec["containers"][0].update({"image": TEST_IMAGE, "args": WORKER, "env": [{"name": "PYTHONHASHSEED",
                                                                                  "value": "0"}], **container})
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all([{"kind": "Namespace", "metadata": {"name": "sealed"}}, doc]))
    return path


def test_measure_from_a_rendered_pod_spec(tmp_path: Path) -> None:
    out = tmp_path / "init-data.json"
    result = CliRunner().invoke(build(), ["measure", "init-data", "--pod", str(worker_deployment(tmp_path)),
                                          "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = InitData.decode(out.read_bytes())
    spec = yaml.safe_load(worker_deployment(tmp_path).read_text().split("---")[-1])["spec"]["template"]["spec"]
    policy = render(spec)
    assert out.with_suffix(".rego").read_text() == policy and document.agent_policy_digest == digest(policy)
    assert document.image == TEST_IMAGE and document.env == {"PYTHONHASHSEED": "0"}
    assert json.loads(result.output)["host_data"] == document.host_data().hex()
    # The worker that pod starts (its arguments, its environment) accepts it as its own.
    check_runs_as_declared(document, WORKER, {"PYTHONHASHSEED": "0", "HOSTNAME": "pod-1"}, parse(WORKER)[1])


@pytest.mark.parametrize(("container", "message"), [
    ({"image": "sealed-worker"}, "pinned by digest"),
    ({"args": ["--broker-url", "$(BROKER_URL)"]}, "literal"),
    ({"env": [{"name": "BROKER_URL", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}, "literal value"),
])
def test_a_pod_that_cannot_be_pinned_is_refused(tmp_path: Path, container: dict, message: str) -> None:
    pod = worker_deployment(tmp_path, **container)
    result = CliRunner().invoke(build(), ["measure", "init-data", "--pod", str(pod)])
    assert result.exit_code != 0 and message in result.output, result.output
