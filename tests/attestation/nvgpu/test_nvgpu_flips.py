"""Seeded single-byte flips of every real report: each one must be rejected with a typed error."""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
from pathlib import Path

import pytest

from attestation.errors import AttestationError
from attestation.nvgpu import parse_evidence, verify_gpu_evidence
from attestation.x509chain import load_pem_chain

NOW = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
FLIPS = 200


def _cases(tv: Path) -> dict[str, tuple[bytes, bytes, bytes]]:
    """name -> (report, PEM chain, nonce)."""
    d = tv / "nvgpu"
    ppcie = json.loads((d / "nvtrust_ppcie_gpu_evidence_8gpu.json").read_text())
    out = {
        "nvtrust": (
            (d / "nvtrust_hopperAttestationReport.bin").read_bytes(),
            (d / "nvtrust_hopperCertChain.pem").read_bytes(),
            bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"),
        ),
        "coco": (
            (d / "trustee_hopper_coco_report1.bin").read_bytes(),
            (d / "trustee_hopper_coco_certs1.txt").read_bytes(),
            bytes.fromhex("87d8e24ab336adafe228d49e83d745f6dba4ae505372b6a5704820856b343fec"),
        ),
    }
    for i, e in enumerate(ppcie):
        out[f"ppcie{i}"] = (
            base64.b64decode(e["evidence"]),
            base64.b64decode(e["certificate"]),
            bytes.fromhex(e["nonce"]),
        )
    return out


@pytest.mark.parametrize("name", ["nvtrust", "coco", *[f"ppcie{i}" for i in range(8)]])
def test_single_byte_flips_rejected(testvectors: Path, name: str) -> None:
    report, pem, nonce = _cases(testvectors)[name]
    chain = load_pem_chain(pem)
    verify_gpu_evidence(report, chain, nonce=nonce, now=NOW)  # the original verifies
    signed_len = len(parse_evidence(report).signed)
    rng = random.Random(f"nvgpu-flips-{name}")
    # Most flips land in the signed region; a fixed share hits r||s so the signature is covered too.
    positions = rng.sample(range(signed_len), FLIPS - 40) + rng.sample(range(signed_len, signed_len + 96), 40)
    for pos in positions:
        mutated = bytearray(report)
        mutated[pos] ^= rng.randrange(1, 256)
        with pytest.raises(AttestationError):
            verify_gpu_evidence(bytes(mutated), chain, nonce=nonce, now=NOW)
