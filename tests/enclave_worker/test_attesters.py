"""The worker's attesters against the fakes at the kernel and driver seams, verified by the real
verifier: configfs-tsm (a FIFO tree answered by a thread), /dev/sev-guest (the ioctl), NVML."""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import os
import threading
from pathlib import Path

import pytest

from attestation.attesters import (
    Attester,
    KernelInterfaces,
    NvgpuAttester,
    SnpAttester,
    TdxAttester,
    hardware_attester,
    parse_tee,
    resolve_tee,
)
from attestation.bundle import EvidenceBundle, RuntimeData
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import AttestationError, FreshnessError, ParseError, UnsupportedError
from attestation.snp.collect import encode_cert_table
from attestation.verifier import VerifierTrust, verify_bundle
from sealed_fakes.fake_nvml import FakeNvml
from sealed_fakes.fake_sev_guest import FakeSevGuest
from sealed_fakes.fake_tsm import FakeTsmTree
from sealed_fakes.platform import SNP_MEASUREMENT, TDX_MR_TD, FakePlatform, gpu_report

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> FakePlatform:
    return FakePlatform.create(tmp_path_factory.mktemp("platform"), gpus=2, now=NOW)


def runtime() -> RuntimeData:
    return RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32))


def trust(platform: FakePlatform) -> VerifierTrust:
    store = CollateralStore(CollateralConfig(platform.root / "collateral", offline=True))
    return VerifierTrust(roots_dir=platform.root / "roots", snp_fetcher=store.snp, tdx_collateral=store.tdx)


def snp_tree(platform: FakePlatform, base: Path) -> FakeTsmTree:
    table = encode_cert_table({"vcek": platform.vcek})
    return FakeTsmTree(base, "sev_guest", lambda data, vmpl: (platform.snp_report(data, vmpl), table))


def test_snp_through_configfs_tsm(platform: FakePlatform, tmp_path: Path) -> None:
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", sev_guest=tmp_path / "absent")
    with snp_tree(platform, kernel.tsm_dir) as tree:
        rt = runtime()
        bundle = Attester(SnpAttester(kernel)).bundle(rt)
        assert tree.reports == 1
    assert bundle.tee == "snp" and bundle.cpu_certificates == (platform.vcek,)
    result = verify_bundle(bundle, expected_nonce=rt.nonce, now=NOW, trust=trust(platform))
    assert result.cpu.measurement == SNP_MEASUREMENT and result.gpus == ()


def test_one_configfs_tsm_entry_answers_report_after_report(platform: FakePlatform, tmp_path: Path) -> None:
    """A worker attests more than once over its life (re-attestation, each client's nonce). The fake
    kernel once answered no attribute twice in a row, so a second report's first read (`generation`,
    the last read of the first report) waited forever; the attester runs in a thread here so that a
    hang fails this test instead of the suite."""
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", sev_guest=tmp_path / "absent")
    with snp_tree(platform, kernel.tsm_dir) as tree:
        nonces = [runtime() for _ in range(3)]
        bundles: list = []
        attester = Attester(SnpAttester(kernel))
        worker = threading.Thread(target=lambda: bundles.extend(attester.bundle(rt) for rt in nonces), daemon=True)
        worker.start()
        worker.join(120)  # a hang guard, not a timing check: three reports take well under a second
        assert len(bundles) == 3, "a later report through the same configfs-tsm entry never came"
        assert tree.reports == 3
    for rt, bundle in zip(nonces, bundles, strict=True):
        verify_bundle(bundle, expected_nonce=rt.nonce, now=NOW, trust=trust(platform))


def test_snp_falls_back_to_the_sev_guest_ioctl(platform: FakePlatform, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A certificate table larger than the first buffer: the driver's EIO + needed-size retry.
    table = encode_cert_table({"vcek": platform.vcek,
                               "00000000-1111-2222-3333-444444444444": b"\x01" * 20000})
    device = FakeSevGuest(tmp_path / "dev" / "sev-guest", lambda data, vmpl: platform.snp_report(data, vmpl), table)
    monkeypatch.setattr(fcntl, "ioctl", device.router(fcntl.ioctl))
    kernel = KernelInterfaces(tsm_dir=tmp_path / "no-configfs", sev_guest=device.device)
    rt = runtime()
    bundle = Attester(SnpAttester(kernel)).bundle(rt)
    assert device.calls == 2  # too small, then the size the "host" asked for
    result = verify_bundle(bundle, expected_nonce=rt.nonce, now=NOW, trust=trust(platform))
    assert result.cpu.measurement == SNP_MEASUREMENT


def test_snp_report_for_other_report_data_is_refused_at_the_attester(platform: FakePlatform,
                                                                      tmp_path: Path) -> None:
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", sev_guest=tmp_path / "absent")
    with FakeTsmTree(kernel.tsm_dir, "sev_guest", lambda data, vmpl: (platform.snp_report(bytes(64)), None)), \
            pytest.raises(FreshnessError):
        SnpAttester(kernel).attest(os.urandom(64))


def test_no_snp_interface_says_why(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="not an SEV-SNP guest"):
        SnpAttester(KernelInterfaces(tmp_path / "none", None, tmp_path / "none2")).attest(bytes(64))


def test_tdx_through_configfs_tsm(platform: FakePlatform, tmp_path: Path) -> None:
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed")
    with FakeTsmTree(kernel.tsm_dir, "tdx_guest", lambda data, _: (platform.tdx_quote(data), None)):
        rt = runtime()
        bundle = Attester(TdxAttester(kernel)).bundle(rt)
    result = verify_bundle(bundle, expected_nonce=rt.nonce, now=NOW, trust=trust(platform))
    assert result.cpu.tee.value == "tdx" and result.cpu.measurement == TDX_MR_TD


CCEL = Path(__file__).resolve().parents[1] / "vectors" / "tdx-ccel"


def test_tdx_sends_the_cc_event_log_and_the_verifier_replays_it(platform: FakePlatform, tmp_path: Path) -> None:
    log = (CCEL / "ccel_data.dat").read_bytes()  # a real TD's log; the fake TD's RTMRs replay from it
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", ccel_table=CCEL / "ccel_table.dat",
                              ccel_data=CCEL / "ccel_data.dat")
    with FakeTsmTree(kernel.tsm_dir, "tdx_guest", lambda data, _: (platform.tdx_quote(data, log), None)):
        rt = runtime()
        bundle = Attester(TdxAttester(kernel)).bundle(rt)
    assert bundle.event_log == log
    verify_bundle(bundle, expected_nonce=rt.nonce, now=NOW, trust=trust(platform))
    # Carried through JSON, and a log that does not replay to the signed RTMRs is refused.
    assert EvidenceBundle.from_json(bundle.to_json()).event_log == log
    tampered = bytearray(log)
    first_event = 32 + int.from_bytes(log[28:32], "little")  # after the SHA-1-format header event
    tampered[first_event + 4 + 4 + 4 + 2] ^= 0xFF  # index, type, digest count, algorithm id: the digest
    with pytest.raises(AttestationError, match="does not replay"):
        verify_bundle(dataclasses.replace(bundle, event_log=bytes(tampered)), expected_nonce=rt.nonce, now=NOW,
                      trust=trust(platform))
    with pytest.raises(AttestationError, match="only accepted with TDX"):
        verify_bundle(dataclasses.replace(bundle, tee="snp"), expected_nonce=rt.nonce, now=NOW, trust=trust(platform))


def test_tdx_refuses_a_sev_guest_provider(platform: FakePlatform, tmp_path: Path) -> None:
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed")
    with FakeTsmTree(kernel.tsm_dir, "sev_guest", lambda data, _: (platform.snp_report(data), None)), \
            pytest.raises(UnsupportedError, match="provider"):
        TdxAttester(kernel).attest(os.urandom(64))


def test_snp_with_gpus_binds_gpu_evidence_and_readies_gpus_only_when_accepted(
        platform: FakePlatform, tmp_path: Path) -> None:
    nvml = FakeNvml.cc_on(platform.gpus, gpu_report)
    kernel = KernelInterfaces(tsm_dir=tmp_path / "tsm", tsm_entry="sealed", sev_guest=tmp_path / "absent")
    attester = Attester(SnpAttester(kernel), NvgpuAttester(nvml))
    with snp_tree(platform, kernel.tsm_dir):
        rt = runtime()
        bundle = attester.bundle(rt)
    assert len(bundle.gpus) == 2 and nvml.ready == 0
    result = verify_bundle(bundle, expected_nonce=rt.nonce, now=NOW, trust=trust(platform))
    assert [g.cc_enabled for g in result.gpus] == [True, True]
    attester.accepted()
    assert nvml.ready == 1


def test_h200_with_cc_off_answers_in_one_line(testvectors: Path) -> None:
    nvml = FakeNvml.from_capture(testvectors.parent / "nvml" / "h200_cc_off_20261130.json")
    with pytest.raises(UnsupportedError) as err:
        NvgpuAttester(nvml).collect(os.urandom(32))
    assert "confidential computing is off" in str(err.value) and "\n" not in str(err.value)
    # What the real driver answers when asked anyway: NVML error 999.
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError) as nv:
        nvml.nvmlDeviceGetConfComputeGpuAttestationReport(nvml.nvmlDeviceGetHandleByIndex(0), bytes(32))
    assert nv.value.value == 999 and str(nv.value) == "Unknown Error"


def test_captured_h100_report_for_another_nonce_is_refused_at_the_attester(testvectors: Path) -> None:
    nv = testvectors / "nvgpu"
    nvml = FakeNvml.replay((nv / "nvtrust_hopperAttestationReport.bin").read_bytes(),
                           (nv / "nvtrust_hopperCertChain.pem").read_bytes())
    with pytest.raises(ParseError, match="different nonce"):
        NvgpuAttester(nvml).collect(os.urandom(32))


@pytest.mark.parametrize(("value", "parsed"), [("sim", ("sim", None)), ("snp", ("snp", None)),
                                               ("tdx+nvgpu", ("tdx", "nvgpu")), ("snp+nvgpu", ("snp", "nvgpu"))])
def test_parse_tee(value: str, parsed: tuple) -> None:
    assert parse_tee(value) == parsed


@pytest.mark.parametrize("value", ["sev", "snp+amdgpu", "sim+nvgpu", ""])
def test_parse_tee_refuses(value: str) -> None:
    with pytest.raises(UnsupportedError):
        parse_tee(value)


def test_auto_never_falls_back_to_the_simulated_tee() -> None:
    from attestation.detect import Capability

    none = [Capability("snp", False, "no snp"), Capability("tdx", False, "no tdx"),
            Capability("nvgpu", False, "no gpu"), Capability("sim", True, "sim")]
    with pytest.raises(UnsupportedError, match="no hardware TEE"):
        resolve_tee("auto", probe=lambda: none)
    tdx = [Capability("tdx", True, "TDX guest"), Capability("nvgpu", True, "cc on")]
    assert resolve_tee("auto+auto", probe=lambda: tdx) == ("tdx", "nvgpu")


@pytest.mark.tee
def test_this_machine_attests(request: pytest.FixtureRequest) -> None:
    """On a real SEV-SNP or TDX guest (`--run-tee`; GPUs too where NVML reports CC on): collect
    evidence with the production interfaces and verify it against the pinned vendor roots. SNP
    verifies offline (VCEK from the host's certificate table); TDX needs Intel PCS collateral, so
    it is verified only with `--run-online` too."""
    from attestation.tdx.pcs import PcsFetcher

    tee, gpu = resolve_tee("auto+auto")
    attester = hardware_attester(tee, gpu, KernelInterfaces())
    rt = runtime()
    bundle = attester.bundle(rt)
    assert bundle.tee == tee and (len(bundle.gpus) > 0) == (gpu is not None)
    if tee == "tdx" and not request.config.getoption("--run-online"):
        pytest.skip("TDX verification needs Intel PCS collateral (add --run-online)")
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / "sealed-pcs-cache"
    result = verify_bundle(bundle, expected_nonce=rt.nonce, now=dt.datetime.now(dt.UTC),
                           trust=VerifierTrust(tdx_collateral=PcsFetcher(cache)))
    assert result.cpu.tee.value == tee
