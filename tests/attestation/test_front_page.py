"""`attestation` is the library's front page: the names a client needs, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import attestation
from attestation.appraisal import AppraisalPolicy
from attestation.client import PinnedWorker, verify_deployment
from attestation.errors import AttestationError
from attestation.verifier import VerifierTrust, verify_bundle


def test_the_front_page_names_are_the_library_s_own() -> None:
    assert attestation.verify_deployment is verify_deployment
    assert attestation.AppraisalPolicy is AppraisalPolicy
    assert attestation.AttestationError is AttestationError
    assert attestation.PinnedWorker is PinnedWorker
    assert attestation.verify_bundle is verify_bundle
    assert attestation.VerifierTrust is VerifierTrust
    assert sorted(attestation.__all__) == sorted(["AppraisalPolicy", "AttestationError", "PinnedWorker",
                                                  "VerifierTrust", "verify_bundle", "verify_deployment"])
    with pytest.raises(AttributeError):
        attestation.verify_everything  # noqa: B018


def test_importing_a_submodule_loads_no_verifier() -> None:
    code = ("import sys, attestation.bundle; "
            "sys.exit(1 if 'attestation.verifier' in sys.modules or 'attestation.client' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
