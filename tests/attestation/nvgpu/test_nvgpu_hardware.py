"""Real Hopper hardware in CC mode (run with --run-gpu): collect through pynvml and verify."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from attestation.nvgpu import to_claims, verify_gpu_list
from attestation.nvgpu.collect import collect_gpu_evidence
from attestation.x509chain import load_pem_chain


@pytest.mark.gpu
def test_collect_and_verify_on_hardware() -> None:
    pytest.importorskip("pynvml")
    nonce = os.urandom(32)
    gpus = collect_gpu_evidence(nonce)  # refuses when CC is off or devtools mode is on
    verified = verify_gpu_list(
        [(g.evidence, load_pem_chain(g.cert_chain)) for g in gpus],
        nonce=nonce,
        now=dt.datetime.now(dt.UTC),
    )
    claims = [to_claims(v, i) for i, v in enumerate(verified)]
    assert all(c.nonce == nonce and len(c.fwid) == 48 for c in claims)
