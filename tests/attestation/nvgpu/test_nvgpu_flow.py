"""Whole sequence under a test PKI in the real formats: fake NVML -> verify -> validate -> claims."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from attestation.claims import GpuClaims
from attestation.errors import (
    ChainError,
    CollateralError,
    FreshnessError,
    ParseError,
    PolicyViolation,
    RevokedError,
    SignatureError,
    UnsupportedError,
)
from attestation.nvgpu import GpuVerifyOptions, Policy, validate, verify_gpu_list
from attestation.nvgpu.collect import CollectedGpu, attest_and_ready, collect_gpu_evidence
from attestation.nvgpu.verify import VerifiedGpu
from attestation.x509chain import load_pem_chain
from sealed_fakes import nvgpu_pki as tp
from tests.attestation.nvgpu.static_ocsp import StaticOcspChecker

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
FWID = bytes(range(48))


@dataclasses.dataclass
class Gpu:
    chain: list[x509.Certificate]
    key: ec.EllipticCurvePrivateKey
    spec: Callable[[bytes], tp.EvidenceSpec]
    mutate: Callable[[bytes], bytes] = lambda b: b


class FakeNvml:
    """The slice of pynvml that collect.py uses, answering from test-PKI GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[Gpu], cc: int = 1, devtools: int = 0, env: int = 2) -> None:
        self.gpus, self.ready, self.open = gpus, None, 0
        self.state = SimpleNamespace(ccFeature=cc, devToolsMode=devtools, environment=env)

    def nvmlInit(self) -> None:
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlSystemGetConfComputeState(self) -> Any:
        return self.state

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i >= len(self.gpus):
            raise self.NVMLError("invalid argument")
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def nvmlDeviceGetConfComputeGpuAttestationReport(self, h: int, nonce: bytes) -> Any:
        g = self.gpus[h]
        report = g.mutate(tp.make_evidence(g.spec(nonce), g.key))
        return SimpleNamespace(attestationReportSize=len(report), attestationReport=report.ljust(8192, b"\0"))

    def nvmlDeviceGetConfComputeGpuCertificate(self, h: int) -> Any:
        chain = tp.pem(self.gpus[h].chain)
        return SimpleNamespace(
            attestationCertChainSize=len(chain), attestationCertChain=chain.ljust(5120, b"\0")
        )

    def nvmlSystemSetConfComputeGpusReadyState(self, state: int) -> None:
        self.ready = state


@pytest.fixture(scope="module")
def pki() -> SimpleNamespace:
    gpus = [tp.make_chain(fwid=FWID) for _ in range(2)]
    rim_chain, rim_key = tp.make_rim_chain()
    spec = tp.EvidenceSpec(nonce=b"\0" * 32, fwid=FWID)
    golden = {i - 1: (v,) for i, v in spec.measurements.items() if i <= 20}
    rim = tp.sign_rim(tp.rim_xml("96.00.9F.00.01", golden), rim_chain, rim_key)
    bad_golden = {**golden, 4: (b"\xee" * 48,)}
    bad_rim = tp.sign_rim(tp.rim_xml("96.00.9F.00.01", bad_golden), rim_chain, rim_key)
    # the driver RIM owns the next indices, disjoint from the VBIOS ones (nvtrust's split)
    driver_golden = {i - 1: (v,) for i, v in spec.measurements.items() if 20 < i <= 40}
    driver_rim = tp.sign_rim(tp.rim_xml("550.90.07", driver_golden), rim_chain, rim_key)
    overlap_rim = tp.sign_rim(tp.rim_xml("550.90.07", {**driver_golden, 3: golden[3]}), rim_chain, rim_key)
    other_root = tp.make_chain()[0][-1]
    return SimpleNamespace(
        gpus=gpus,
        rim_chain=rim_chain,
        rim=rim,
        bad_rim=bad_rim,
        driver_rim=driver_rim,
        overlap_rim=overlap_rim,
        other_root=other_root,
        rim_key=rim_key,
    )


def _nvml(pki: SimpleNamespace, **kw: Any) -> FakeNvml:
    spec_kw = kw.pop("spec", {})
    mutate = kw.pop("mutate", lambda b: b)
    gpus = [
        Gpu(chain, key, lambda n: tp.EvidenceSpec(**{"nonce": n, "fwid": FWID, **spec_kw}), mutate)
        for chain, key in pki.gpus
    ]
    return FakeNvml(gpus, **kw)


GOOD = Policy(
    allowed_driver_versions=frozenset({"550.90.07"}),
    min_vbios_version="96.00.9F.00.01",
    expected_gpu_count=2,
    allowed_feature_flags=frozenset({"SPT"}),
)


def _verify(pki: SimpleNamespace, gpus: list[CollectedGpu], nonce: bytes, **kw: Any) -> list[VerifiedGpu]:
    items = [(g.evidence, load_pem_chain(g.cert_chain)) for g in gpus]
    args: dict[str, Any] = {
        "roots": [pki.gpus[0][0][-1], pki.gpus[1][0][-1]],
        "rim_roots": [pki.rim_chain[-1]],
        "rims": [pki.rim, pki.driver_rim],
        "ocsp": StaticOcspChecker(good=_serials(pki)),
    }
    args.update(kw)
    return verify_gpu_list(items, nonce=nonce, now=NOW, options=_options(args))


def _options(args: dict[str, Any]) -> GpuVerifyOptions:
    return GpuVerifyOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})


def _serials(pki: SimpleNamespace) -> frozenset[int]:
    certs = [c for chain, _ in pki.gpus for c in chain] + pki.rim_chain
    return frozenset(c.serial_number for c in certs)


def test_full_sequence_sets_ready(pki: SimpleNamespace) -> None:
    nonce = os.urandom(32)
    nvml = _nvml(pki)

    def check(gpus: list[CollectedGpu]) -> list[GpuClaims]:
        return validate(_verify(pki, gpus, nonce), dataclasses.replace(GOOD, expected_nonce=nonce))

    claims = attest_and_ready(nonce, check, nvml)
    assert nvml.ready == 1 and nvml.open == 0
    assert [c.index for c in claims] == [0, 1]
    assert all(c.rim_matched and c.nonce == nonce and c.fwid == FWID for c in claims)
    assert claims[0].ueid == str(pki.gpus[0][0][0].serial_number)
    assert claims[0].measurements[3] == bytes([3]) * 48


def test_failed_verification_leaves_gpus_not_ready(pki: SimpleNamespace) -> None:
    nvml = _nvml(pki)
    with pytest.raises(FreshnessError):
        attest_and_ready(os.urandom(32), lambda g: _verify(pki, g, os.urandom(32)), nvml)
    assert nvml.ready is None and nvml.open == 0


def _flip_sig(b: bytes) -> bytes:
    return b[:-1] + bytes([b[-1] ^ 1])


NEGATIVES: list[tuple[str, dict[str, Any], dict[str, Any], type[Exception], str]] = [
    # (name, fake NVML options, verify options, error, message fragment)
    ("wrong nonce (replay)", {}, {"nonce": b"\x01" * 32}, FreshnessError, "not the expected"),
    ("wrong root, same name", {}, {"roots": "other"}, ChainError, "does not verify under its issuer"),
    ("real NVIDIA root pinned", {}, {"roots": None}, ChainError, "does not end at a pinned root"),
    ("fwid mismatch", {"spec": {"fwid": b"\x22" * 48}}, {}, ChainError, "FWID"),
    ("bad signature", {"mutate": _flip_sig}, {}, SignatureError, "signature"),
    ("truncated", {"mutate": lambda b: b[:-10]}, {}, ParseError, "signature"),
    ("extended", {"mutate": lambda b: b + b"\0\0"}, {}, ParseError, "after the signature"),
    ("extended non-zero", {"mutate": lambda b: b + b"\x07"}, {}, ParseError, "after the signature"),
    ("revoked leaf", {}, {"ocsp": "revoke-leaf"}, RevokedError, "revoked"),
    ("revoked intermediate", {}, {"ocsp": "revoke-ica"}, RevokedError, "Provisioner"),
    ("expired chain", {}, {"now": dt.datetime(2040, 1, 1, tzinfo=dt.UTC)}, ChainError, "after"),
    ("rim other root", {}, {"rim_roots": "other"}, ChainError, "RIM signing chain"),
]


@pytest.mark.parametrize(("name", "nv", "ver", "error", "match"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_negative_table(
    pki: SimpleNamespace, name: str, nv: dict, ver: dict, error: type, match: str
) -> None:
    nonce = os.urandom(32)
    mutate = nv.get("mutate")
    if mutate is not None and name in ("truncated", "extended", "extended non-zero", "bad signature"):
        gpus = collect_gpu_evidence(nonce, _nvml(pki))
        gpus = [dataclasses.replace(g, evidence=mutate(g.evidence)) for g in gpus]
    else:
        gpus = collect_gpu_evidence(nonce, _nvml(pki, **nv))
    kw = dict(ver)
    if kw.get("roots") == "other" or kw.get("rim_roots") == "other":
        kw = {k: ([pki.other_root] if v == "other" else v) for k, v in kw.items()}
    if kw.get("ocsp") == "revoke-leaf":
        kw["ocsp"] = StaticOcspChecker(revoked=frozenset({pki.gpus[1][0][0].serial_number}))
    if kw.get("ocsp") == "revoke-ica":
        kw["ocsp"] = StaticOcspChecker(revoked=frozenset({pki.gpus[0][0][2].serial_number}))
    now = kw.pop("now", NOW)
    expect_nonce = kw.pop("nonce", nonce)
    items = [(g.evidence, load_pem_chain(g.cert_chain)) for g in gpus]
    args: dict[str, Any] = {
        "roots": [pki.gpus[0][0][-1], pki.gpus[1][0][-1]],
        "rim_roots": [pki.rim_chain[-1]],
        "rims": [pki.rim],
    }
    args.update(kw)
    with pytest.raises(error, match=match):
        verify_gpu_list(items, nonce=expect_nonce, now=now, options=_options(args))


def test_cc_off_and_devtools_refused_at_collection(pki: SimpleNamespace) -> None:
    with pytest.raises(UnsupportedError, match="confidential computing is off"):
        collect_gpu_evidence(os.urandom(32), _nvml(pki, cc=0))
    nvml = _nvml(pki, devtools=1)
    with pytest.raises(PolicyViolation, match="devtools"):
        attest_and_ready(os.urandom(32), lambda g: g, nvml)
    assert nvml.ready is None and nvml.open == 0
    with pytest.raises(PolicyViolation) as err:
        collect_gpu_evidence(os.urandom(32), _nvml(pki, devtools=1, env=1))
    assert len(err.value.violations) == 2


def test_nvml_errors_are_typed(pki: SimpleNamespace) -> None:
    nvml = _nvml(pki)
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(FakeNvml.NVMLError("not supported"))  # type: ignore[method-assign]
    with pytest.raises(UnsupportedError, match="NVML"):
        collect_gpu_evidence(os.urandom(32), nvml)
    with pytest.raises(ParseError, match="different nonce"):
        collect_gpu_evidence(
            os.urandom(32),
            FakeNvml([Gpu(pki.gpus[0][0], pki.gpus[0][1], lambda n: tp.EvidenceSpec(nonce=b"\x09" * 32))]),
        )


def test_policy_violations_reported_together(pki: SimpleNamespace) -> None:
    nonce = os.urandom(32)
    gpus = collect_gpu_evidence(nonce, _nvml(pki, spec={"driver": "535.104.05"}))
    verified = _verify(pki, gpus, nonce, rims=[pki.bad_rim], ocsp=StaticOcspChecker())
    verified = [dataclasses.replace(verified[0], cc_enabled=False), verified[1]]  # a claim of CC off
    policy = dataclasses.replace(GOOD, expected_gpu_count=3, allowed_feature_flags=frozenset({"PPCIE"}))
    with pytest.raises(PolicyViolation) as err:
        validate(verified, policy)
    text = "\n".join(err.value.violations)
    for fragment in (
        "2 GPUs attested, policy expects 3",
        "GPU 0: confidential computing is not enabled",
        "GPU 1: no driver RIM was provided",
        "driver version 535.104.05",
        "do not match the RIM (96.00.9F.00.01 index 4)",
        "feature flag SPT",
        "OCSP",
    ):
        assert fragment in text
    assert len(err.value.violations) == 1 + 2 * 5 + 1  # count + 5 per GPU + CC off on GPU 0
    # OCSP unknown is accepted only by the explicitly unsafe switch, which logs a warning
    relaxed = dataclasses.replace(GOOD, unsafe_allow_ocsp_unknown=True)
    good = collect_gpu_evidence(nonce, _nvml(pki))
    assert len(validate(_verify(pki, good, nonce, ocsp=StaticOcspChecker()), relaxed)) == 2


def test_default_policy_denies(pki: SimpleNamespace) -> None:
    nonce = os.urandom(32)
    verified = _verify(pki, collect_gpu_evidence(nonce, _nvml(pki)), nonce, rims=[])
    with pytest.raises(PolicyViolation) as err:
        validate(verified, Policy())
    assert any("no driver version" in v for v in err.value.violations)
    assert any("no RIM" in v for v in err.value.violations)


def test_policy_from_dict() -> None:
    p = Policy.from_dict(
        {
            "allowed_driver_versions": ["550.90.07"],
            "min_vbios_version": "96.00.74.00.1A",
            "expected_nonce": "ab" * 32,
            "unsafe_allow_ocsp_unknown": True,
        }
    )
    assert p.expected_nonce == b"\xab" * 32 and p.allowed_driver_versions == frozenset({"550.90.07"})
    with pytest.raises(PolicyViolation) as err:
        Policy.from_dict({"bogus": 1, "other": 2, "require_cc": "yes", "min_vbios_version": "zz"})
    assert len(err.value.violations) == 4


def test_rim_set_rules(pki: SimpleNamespace) -> None:
    nonce = os.urandom(32)
    gpus = collect_gpu_evidence(nonce, _nvml(pki))
    with pytest.raises(CollateralError, match="more than one vbios RIM"):
        _verify(pki, gpus, nonce, rims=[pki.rim, pki.bad_rim])
    with pytest.raises(CollateralError, match="same measurement index"):
        _verify(pki, gpus, nonce, rims=[pki.rim, pki.overlap_rim])
    only_vbios = _verify(pki, gpus, nonce, rims=[pki.rim])
    with pytest.raises(PolicyViolation) as err:
        validate(only_vbios, GOOD)
    assert err.value.violations == ["GPU 0: no driver RIM was provided", "GPU 1: no driver RIM was provided"]
    with pytest.raises(CollateralError, match="apply to no GPU"):
        _verify(
            pki,
            gpus,
            nonce,
            rims=[tp.sign_rim(tp.rim_xml("1.2.3", {0: (b"\0" * 48,)}), pki.rim_chain, pki.rim_key)],
        )
