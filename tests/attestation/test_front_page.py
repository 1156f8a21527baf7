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


def test_the_docstring_example_calls_verify_deployment_as_it_is_defined() -> None:
    """The front page's example must run as written: every keyword it passes exists, and every
    required keyword-only parameter is passed (a stale example once omitted `evidence_trust`)."""
    import inspect
    import re

    doc = attestation.__doc__ or ""
    call = doc[doc.index("verify_deployment(\"") :]
    call = call[: call.index(")\n")]
    passed = set(re.findall(r"(\w+)=", call))
    params = inspect.signature(verify_deployment).parameters
    assert passed <= set(params), passed - set(params)
    required = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty}
    assert required <= passed, required - passed
    example_names = set(re.findall(r"from attestation import ([\w, ]+)", doc)[0].replace(" ", "").split(","))
    assert example_names <= set(attestation.__all__)
