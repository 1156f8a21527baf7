"""The worker's start check: it runs what its init-data says (else its command line exits with
EXIT_CONFIG_ERROR), and no report leaves it unless its hardware carries that init-data's digest
(fake configfs-tsm SNP and TDX at the kernel seam)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path

import pytest

from attestation.attesters import Attester, KernelInterfaces, SnpAttester, TdxAttester
from attestation.bundle import RuntimeData
from attestation.errors import WorkloadMismatch
from attestation.initdata import InitData
from attestation.snp.collect import encode_cert_table
from enclave_worker.cli import main, parse
from enclave_worker.settings import WorkerSettings
from enclave_worker.workload_check import (
    check_runs_as_declared,
    init_data_for,
    measured_argv,
    measured_env,
)
from protocol.exit_codes import EXIT_CONFIG_ERROR
from sealed_fakes.fake_tsm import FakeTsmTree
from sealed_fakes.platform import FakePlatform

IMAGE = "sealed-worker@sha256:" + "ab" * 32
ARGV = ["--broker-url", "https://broker.example", "--package-dir", "/pkg", "--tenant", "acme", "--model", "m",
        "--version", "v1", "--grpc-port", "50051", "--tee", "snp", "--min-policy-version", "2",
        "--tsm-dir", "/sys/kernel/config/tsm/report", "--advertise-host=10.0.0.7"]
ENV = {"PATH": "/usr/bin", "HOSTNAME": "pod-1", "PYTHONHASHSEED": "0", "SEALED_X": "1"}


def settings_of(argv: list[str]) -> WorkerSettings:
    return parse(argv)[1]


def declared() -> InitData:
    return init_data_for(IMAGE, ARGV, ENV, settings_of(ARGV))


def test_interface_paths_and_pod_address_are_not_measured() -> None:
    assert "--tsm-dir" not in measured_argv(ARGV) and "--advertise-host=10.0.0.7" not in measured_argv(ARGV)
    assert measured_argv(["--tsm-entry", "x", "--tee", "snp", "--init-data=/a"]) == ("--tee", "snp")
    assert measured_env(ENV) == {"PYTHONHASHSEED": "0", "SEALED_X": "1"}


def test_the_declared_workload_passes() -> None:
    moved = [*ARGV[:-3], "--tsm-dir", "/elsewhere", "--advertise-host=10.0.0.8"]
    check_runs_as_declared(declared(), moved, {**ENV, "HOSTNAME": "pod-2"}, settings_of(moved))


@pytest.mark.parametrize(("name", "argv", "env", "match"), [
    ("another-broker-url", [a.replace("broker.example", "evil.example") for a in ARGV], ENV, "arguments"),
    ("one-changed-argument", [a.replace("50051", "50052") for a in ARGV], ENV, "arguments"),
    ("unsafe-switch", [*ARGV, "--unsafe-no-tenant-policy"], ENV, "arguments"),
    ("changed-env-var", ARGV, {**ENV, "PYTHONHASHSEED": "1"}, "environment differs.*PYTHONHASHSEED"),
    ("added-env-var", ARGV, {**ENV, "LD_PRELOAD": "/tmp/x.so"}, "environment differs.*LD_PRELOAD"),
    *((f"threading-runtime-{name}", ARGV, {**ENV, name: value}, f"environment differs.*{name}") for name, value in [
        ("GOMP_SPINCOUNT", "0"), ("OPENBLAS_NUM_THREADS", "1"), ("GOTO_NUM_THREADS", "1"),
        ("ONEDNN_MAX_CPU_ISA", "SSE41"), ("DNNL_MAX_CPU_ISA", "SSE41"), ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),
        ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1")]),
    ("lower-policy-floor", [a.replace("--min-policy-version", "--max-num-seqs") for a in ARGV], ENV, "floor"),
])
def test_a_worker_that_differs_from_its_init_data_is_refused(name: str, argv: list[str], env: dict, match: str
                                                              ) -> None:
    with pytest.raises(WorkloadMismatch, match=match):
        check_runs_as_declared(declared(), argv, env, settings_of(argv))


def test_measured_configuration_is_compared(tmp_path: Path) -> None:
    """The same arguments, but the policy-admin key file they name has other bytes."""
    key = tmp_path / "admin.pem"
    key.write_bytes(b"one")
    argv = [*ARGV, "--policy-admin-key", str(key)]
    init = init_data_for(IMAGE, argv, ENV, settings_of(argv))
    key.write_bytes(b"two")
    with pytest.raises(WorkloadMismatch, match=r"measured configuration differs.*policy_admin_key"):
        check_runs_as_declared(init, argv, ENV, settings_of(argv))


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> FakePlatform:
    return FakePlatform.create(tmp_path_factory.mktemp("platform"), gpus=1, now=dt.datetime.now(dt.UTC))


@pytest.mark.parametrize("launched_with", ["declared", "other"])
@pytest.mark.parametrize("tee", ["snp", "tdx"])
def test_evidence_must_carry_the_init_data_digest(platform: FakePlatform, tmp_path: Path, tee: str,
                                                  launched_with: str) -> None:
    """The worker was handed `declared()`; the host launched the guest with it, or with other
    init-data (whose digest the relying parties allow, say): a report of the latter never leaves."""
    init = declared()
    launched = init if launched_with == "declared" else dataclasses.replace(init, min_policy_version=1)
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", sev_guest=tmp_path / "absent")
    table = encode_cert_table({"vcek": platform.vcek})

    def report(data: bytes, vmpl: int) -> tuple[bytes, bytes | None]:
        if tee == "snp":
            return platform.snp_report(data, vmpl, host_data=launched.host_data()), table
        return platform.tdx_quote(data, mr_config_id=launched.mr_config_id()), None

    cpu = SnpAttester(kernel) if tee == "snp" else TdxAttester(kernel)
    attester = Attester(cpu, init_data_digest=init.digest_for(tee))
    rt = RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32))
    with FakeTsmTree(kernel.tsm_dir, "sev_guest" if tee == "snp" else "tdx_guest", report):
        if launched_with == "declared":
            assert attester.bundle(rt).tee == tee
        else:
            with pytest.raises(WorkloadMismatch, match="other init-data"):
                attester.bundle(rt)


def test_worker_without_init_data_on_hardware_does_not_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGV) == EXIT_CONFIG_ERROR
    assert "refusing to start: WorkloadMismatch: no --init-data" in capsys.readouterr().err


def test_worker_with_mismatching_init_data_does_not_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    path = tmp_path / "init-data.json"
    path.write_bytes(declared().encode())
    argv = [*ARGV, "--init-data", str(path), "--unsafe-no-tenant-policy"]
    assert main(argv) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "refusing to start: WorkloadMismatch: arguments differ" in err, err



def test_the_release_policy_floor_is_measured(tmp_path: Path) -> None:
    """`--min-release-policy-version` is in the measured configuration (so in the init-data): a worker
    started with a lower floor than its init-data declares is refused; no floor without the tenant's key."""
    key = tmp_path / "admin.pem"
    key.write_bytes(b"tenant key")
    argv = [*ARGV, "--policy-admin-key", str(key), "--min-release-policy-version", "4"]
    settings = settings_of(argv)
    assert settings.measured_config()["min_release_policy_version"] == 4
    assert "min_release_policy_version" not in settings_of(ARGV).measured_config()
    lowered = [a.replace("4", "3") if a == "4" else a for a in argv]
    with pytest.raises(WorkloadMismatch, match="arguments"):
        check_runs_as_declared(init_data_for(IMAGE, argv, ENV, settings), lowered, ENV, settings_of(lowered))
    with pytest.raises(ValueError, match="needs policy_admin_key"):
        dataclasses.replace(settings_of(ARGV), min_release_policy_version=4)
