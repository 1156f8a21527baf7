"""`sealed measure snp` reproduces the published virtee/sev-snp-measure vectors, and refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import build
from attestation.errors import ParseError
from attestation.snp.launch_digest import DirectBoot, ovmf_digest, snp_launch_digest
from attestation.snp.ovmf import parse_ovmf, read_ovmf
from attestation.snp.vmsa import VCPU_TYPES, VmmType, cpu_signature

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "snp-measure"
AMDSEV, OVMFX64 = VECTORS / "ovmf_AmdSev_suffix.bin", VECTORS / "ovmf_OvmfX64_suffix.bin"
EPYC_V4 = VCPU_TYPES["EPYC-v4"]
EMPTY_BOOT = DirectBoot(kernel=b"", initrd=b"", append="")  # upstream passes /dev/null for both files
AMDSEV_OVMF_HASH = "086e2e9149ebf45abdc3445fba5b2da8270bdbb04094d7a2c37faaa4b24af3aa16aff8c374c2a55c467a50da6d466b74"

# (firmware, vcpus, boot, guest features, vmm, vcpu signature, upstream expected measurement)
UPSTREAM = [
    (AMDSEV, 1, DirectBoot(b"", b"", "console=ttyS0 loglevel=7"), 0x21, VmmType.QEMU, EPYC_V4,
     "803f691094946e42068aaa3a8f9e26a5c89f36f7b73ecfb28c653360fe4b3aba7e534442e7e1e17895dfe778d0228977"),
    (AMDSEV, 1, DirectBoot(b"", b"", "console=ttyS0 loglevel=7"), 0x1, VmmType.QEMU, EPYC_V4,
     "6d287813eb5222d770f75005c664e34c204f385ce832cc2ce7d0d6f354454362f390ef83a92046c042e706363b4b08fa"),
    (AMDSEV, 1, None, 0x21, VmmType.QEMU, EPYC_V4,
     "e1e1ca029dd7973ab9513295be68198472dcd4fc834bd9af9b63f6e8a1674dbf281a9278a4a2ebe0eed9f22adbcd0e2b"),
    (AMDSEV, 1, None, 0x1, VmmType.QEMU, EPYC_V4,
     "19358ba9a7615534a9a1e2f0dfc29384dcd4dcb7062ff9c6013b26869a5fc6ecabe033c48dd6f6db5d6d76e7c5df632d"),
    (AMDSEV, 4, EMPTY_BOOT, 0x21, VmmType.QEMU, EPYC_V4,
     "4953b1fb416fa874980e8442b3706d345926d5f38879134e00813c5d7abcbe78eafe7b422907be0b4698e2414a631942"),
    (AMDSEV, 4, EMPTY_BOOT, 0x1, VmmType.QEMU, EPYC_V4,
     "5061fffb019493a903613d56d54b94912a1a2f9e4502385f5c194616753720a92441310ba6c4933de877c36e23046ad5"),
    (OVMFX64, 1, None, 0x21, VmmType.QEMU, EPYC_V4,
     "28797ae0afaba4005a81e629acebfb59e6687949d6be44007cd5506823b0dd66f146aaae26ff291eed7b493d8a64c385"),
    (OVMFX64, 1, None, 0x1, VmmType.QEMU, EPYC_V4,
     "da0296de8193586a5512078dcd719eccecbd87e2b825ad4148c44f665dc87df21e5b49e21523a9ad993afdb6a30b4005"),
    (AMDSEV, 1, EMPTY_BOOT, 0x21, VmmType.EC2, EPYC_V4,
     "0ce9ccc06bab55eebe8abc234f3df6514883977a68a591b71052498ab52b2f1aa415db338033946ef93aa8278c0d67fb"),
    (AMDSEV, 1, EMPTY_BOOT, 0x1, VmmType.EC2, EPYC_V4,
     "0883bd0eeb716e65b7b977a321c278d1e51b33b5c655fab985443bbcc65c086b9c15e8a0bd8811050dec7e24964e5056"),
    (AMDSEV, 1, EMPTY_BOOT, 0x1, VmmType.GCE, 0,
     "5da7106cf14cf46b1725ebab123eb9e53bd46a1e9f400cd0c08e7827b04b688ea8b4e403c8404efed4397ea5d5d0722e"),
    (AMDSEV, 4, EMPTY_BOOT, 0x1, VmmType.GCE, 0,
     "5c5debf100fc339f90276e761ee1f1658d08922c3b20e2a2e6c7a6c3370b2452a15a00eae11886a93d6fd1e7ab81e29d"),
]


@pytest.mark.parametrize("firmware, vcpus, boot, features, vmm, sig, expected", UPSTREAM)
def test_reproduces_upstream_measurement(firmware: Path, vcpus: int, boot: DirectBoot | None, features: int,
                                         vmm: VmmType, sig: int, expected: str) -> None:
    digest = snp_launch_digest(read_ovmf(firmware), vcpus=vcpus, vcpu_sig=sig, boot=boot,
                               guest_features=features, vmm=vmm)
    assert digest.hex() == expected


def test_ovmf_hash_alone_and_as_a_seed() -> None:
    ovmf = read_ovmf(AMDSEV)
    assert ovmf_digest(ovmf).hex() == AMDSEV_OVMF_HASH
    seeded = snp_launch_digest(ovmf, vcpus=1, vcpu_sig=EPYC_V4, boot=EMPTY_BOOT, guest_features=0x21,
                               ovmf_hash=bytes.fromhex(AMDSEV_OVMF_HASH))
    assert seeded.hex() == ("329c8ce0972ae52343b64d34a434a86f245dfd74f5ed7aae"
                            "15d22efc78fb9683632b9b50e4e1d7fa41179ef98a7ef198")


def test_cpu_signature_table() -> None:
    assert cpu_signature(23, 1, 2) == 0x800F12 == VCPU_TYPES["EPYC-v4"]
    assert VCPU_TYPES["EPYC-Milan"] == 0xA00F11 and VCPU_TYPES["EPYC-Genoa"] == 0xA10F10


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:100], "multiple of 4096"),
    (lambda d: b"", "multiple of 4096"),
    (lambda d: d[:-50] + b"\xff\xff" + d[-48:], "footer table size"),
    (lambda d: _corrupt_metadata_signature(d), "ASEV"),
])
def test_malformed_firmware_is_a_parse_error(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError, match=message):
        parse_ovmf(mutate(AMDSEV.read_bytes()))


def _corrupt_metadata_signature(data: bytes) -> bytes:
    start = data.index(b"ASEV")
    return data[:start] + b"XSEV" + data[start + 4:]


def test_kernel_with_firmware_without_kernel_hashes_is_refused() -> None:
    with pytest.raises(ParseError, match="no SNP_KERNEL_HASHES"):
        snp_launch_digest(read_ovmf(OVMFX64), vcpus=1, vcpu_sig=EPYC_V4, boot=EMPTY_BOOT)


def test_zero_vcpus_is_refused() -> None:
    with pytest.raises(ParseError, match="at least one vCPU"):
        snp_launch_digest(read_ovmf(AMDSEV), vcpus=0, vcpu_sig=EPYC_V4)


def test_cli_prints_the_measurement(tmp_path: Path) -> None:
    kernel, initrd = tmp_path / "vmlinuz", tmp_path / "initrd"
    kernel.write_bytes(b"")
    initrd.write_bytes(b"")
    result = CliRunner().invoke(build(), ["measure", "snp", "--ovmf", str(AMDSEV), "--kernel", str(kernel),
                                          "--initrd", str(initrd), "--append", "console=ttyS0 loglevel=7",
                                          "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--guest-features", "0x21",
                                          "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["measurement"] == UPSTREAM[0][-1]
    assert doc["tee"] == "snp" and doc["vcpus"] == 1 and doc["vmm"] == "qemu"


def test_cli_refuses_an_unknown_vcpu_type() -> None:
    result = CliRunner().invoke(build(), ["measure", "snp", "--ovmf", str(AMDSEV), "--vcpus", "1",
                                          "--vcpu-type", "Pentium"])
    assert result.exit_code != 0
    assert "EPYC-v4" in result.output
