"""`sealed attest verify` on NVIDIA's NRAS request / multi-GPU object, `--json` with one type per
field across TEEs, and `sealed attest collateral import|status`."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import build
from sealed_fakes.platform import FakePlatform

PPCIE_NONCE = "4760e30534a0621357d458b1a7936551b5dc4cd1e69718adf7ed9fb0252a537e"
PPCIE_AT = "2025-10-01T00:00:00Z"


def sealed(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build(), list(args))
    return result.exit_code, result.output


def nras_request(tv: Path, tmp_path: Path, **over: object) -> Path:
    entries = json.loads((tv / "nvgpu" / "nvtrust_ppcie_gpu_evidence_8gpu.json").read_text())
    doc = {"arch": "HOPPER", "nonce": PPCIE_NONCE, "claims_version": "3.0",
           "evidence_list": [{"evidence": e["evidence"], "certificate": e["certificate"]} for e in entries], **over}
    path = tmp_path / "nras.json"
    path.write_text(json.dumps(doc))
    return path


def test_nras_request_with_eight_gpus_verifies_all_eight(testvectors: Path, tmp_path: Path) -> None:
    code, out = sealed("attest", "verify", "--tee", "nvgpu", "--evidence", str(nras_request(testvectors, tmp_path)),
                       "--nonce", PPCIE_NONCE, "--at", PPCIE_AT, "--json")
    assert code == 0, out
    claims = json.loads(out)
    assert len(claims["gpus"]) == 8 and claims["fresh"] is True
    assert len({g["ueid"] for g in claims["gpus"]}) == 8


def test_nras_request_refusals(testvectors: Path, tmp_path: Path) -> None:
    # The document's nonce must be the reports' nonce; an unsupported arch is refused by name.
    code, out = sealed("attest", "verify", "--tee", "nvgpu", "--at", PPCIE_AT, "--evidence",
                       str(nras_request(testvectors, tmp_path, nonce="00" * 32)))
    assert code == 1 and "differs" in out
    code, out = sealed("attest", "verify", "--tee", "nvgpu", "--at", PPCIE_AT, "--evidence",
                       str(nras_request(testvectors, tmp_path, arch="BLACKWELL")))
    assert code == 1 and "arch" in out
    code, out = sealed("attest", "verify", "--tee", "nvgpu", "--nonce", "11" * 32, "--at", PPCIE_AT,
                       "--evidence", str(nras_request(testvectors, tmp_path)))
    assert code == 1 and "NOT verified" in out


def test_json_has_one_type_per_field_across_tees(testvectors: Path, tmp_path: Path) -> None:
    tdx = testvectors / "tdx"
    runs = {
        "snp": ["--tee", "snp", "--evidence", str(testvectors / "snp" / "gosevguest_milan_attestation.bin"),
                "--cert", str(testvectors / "snp" / "gosevguest_milan_vcek.der"), "--at", "2022-09-24T01:00:00Z"],
        "tdx": ["--tee", "tdx", "--evidence", str(tdx / "trustee_tdx_quote_4.dat"), "--at", "2023-07-01T01:00:00Z",
                *[a for n in ("gotdxguest_sample_tcbInfo_response", "gotdxguest_pckcrl",
                              "gotdxguest_sample_qeIdentity_response", "gotdxguest_rootcrl.der",
                              "gotdxguest_tcbInfoIssuerChain.pem", "gotdxguest_pckCrlIssuerChain.pem")
                  for a in ("--collateral", str(tdx / n))]],
        "nvgpu": ["--tee", "nvgpu", "--evidence", str(nras_request(testvectors, tmp_path)), "--at", PPCIE_AT],
    }
    outputs = {}
    for tee, args in runs.items():
        code, out = sealed("attest", "verify", *args, "--json")
        assert code == 0, (tee, out)
        outputs[tee] = json.loads(out)
    types: dict[str, set[str]] = {}
    for out in outputs.values():
        dt.datetime.fromisoformat(out["verified_at"])  # everywhere, and a time
        for key, value in out.items():
            types.setdefault(key, set()).add(type(value).__name__)
    assert {k: t for k, t in types.items() if len(t) > 1} == {}
    assert outputs["snp"]["vmpl"] == 0 and isinstance(outputs["snp"]["crl_checked"], bool)
    assert isinstance(outputs["tdx"]["quote_version"], int) and "crls_checked" not in outputs["tdx"]
    # Booleans are JSON booleans (SNP's guest policy bit was printed as the string "false").
    assert outputs["snp"]["migrate_ma"] is False and outputs["tdx"]["migratable"] is False
    assert not [(tee, k) for tee, out in outputs.items() for k, v in out.items() if v in ("true", "false")]


SNP_REPORT = ("snp", "gosevguest_milan_attestation.bin")


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--nonce", "zz", "--nonce must be hex"),
    ("--nonce", "abc", "--nonce must be hex"),  # an odd number of digits
    ("--at", "yesterday", "--at must be an ISO 8601 time"),
    ("--at", "2025-13-01", "--at must be an ISO 8601 time"),
])
def test_a_bad_nonce_or_time_is_one_line_not_a_traceback(testvectors: Path, option: str, value: str,
                                                         says: str) -> None:
    result = CliRunner().invoke(build(), ["attest", "verify", "--tee", "snp", "--evidence",
                                          str(testvectors.joinpath(*SNP_REPORT)), option, value])
    assert (result.exit_code == 2 and result.exception is None) or isinstance(result.exception, SystemExit)
    assert result.output.strip() == f"sealed attest verify: {says}" + result.output.strip().split(says, 1)[1]
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert says in result.output and repr(value) in result.output


def test_collateral_import_and_status(tmp_path: Path) -> None:
    platform = FakePlatform.create(tmp_path / "p", gpus=1, now=dt.datetime.now(dt.UTC) - dt.timedelta(days=90))
    store = tmp_path / "store"
    code, out = sealed("attest", "collateral", "import", str(platform.root / "bundle"), "--store", str(store))
    assert code == 0 and "imported 7" in out, out
    code, out = sealed("attest", "collateral", "status", "--store", str(store), "--json")
    items = json.loads(out)["items"]
    assert {(i["source"], i["kind"]) for i in items} >= {("amd", "crl"), ("intel", "tcbInfo"),
                                                        ("intel", "qeIdentity"), ("intel", "crl")}
    assert all(i["expired"] for i in items if i["kind"] in ("crl", "tcbInfo", "qeIdentity"))
    code, out = sealed("attest", "collateral", "status", "--store", str(store))
    assert code == 1 and "EXPIRED" in out  # a broker with this store would refuse, and says why
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "x.bin").write_bytes(base64.b64encode(b"not collateral"))
    code, out = sealed("attest", "collateral", "import", str(junk), "--store", str(store))
    assert code == 1 and "refused" in out


def test_collateral_import_of_nvidia_rims_and_ocsp_answers(tmp_path: Path) -> None:
    """Issue #33: the NVIDIA part of an offline bundle (RIMs, OCSP answers) imports like the rest,
    and `status` says what each answer is and until when it counts."""
    now = dt.datetime.now(dt.UTC)
    platform = FakePlatform.create(tmp_path / "p", gpus=1, now=now)
    platform.write_collateral(now, revoked_gpus={0})
    store = tmp_path / "store"
    code, out = sealed("attest", "collateral", "import", str(platform.root / "bundle"), "--store", str(store))
    assert code == 0 and "imported 15" in out, out  # 7 AMD/Intel, 2 RIMs, 6 OCSP answers (GPU 4 + RIM 2)
    code, out = sealed("attest", "collateral", "status", "--store", str(store), "--json")
    nvidia = [i for i in json.loads(out)["items"] if i["source"] == "nvidia"]
    assert sorted(i["subject"] for i in nvidia if i["kind"] == "rim") == ["550.90.07", "96.00.9F.00.01"]
    answers = [i for i in nvidia if i["kind"] == "ocsp"]
    assert len(answers) == 6 and not any(i["expired"] for i in answers)
    assert sum(i["subject"].endswith(": revoked") for i in answers) == 1
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "rim.xml").write_bytes(b"<SoftwareIdentity/>")  # XML, but no RIM: refused, not stored
    code, out = sealed("attest", "collateral", "import", str(junk), "--store", str(store))
    assert code == 1 and "refused" in out and "not an NVIDIA RIM" in out
