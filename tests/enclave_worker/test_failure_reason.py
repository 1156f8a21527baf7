"""A failed boot is reported by category (for /readyz and the control loop), never by its text."""

from __future__ import annotations

import httpx
import pytest

from enclave_worker.lifecycle import failure_reason
from policy.errors import PolicyInvalid
from protocol.broker.errors import BrokerRateLimited, BrokerRefused
from protocol.package.errors import PackageIntegrityError, PackageSignatureError


@pytest.mark.parametrize(("exc", "reason"), [
    (BrokerRefused("secret detail"), "key release refused by the key broker"),
    (BrokerRateLimited("x"), "key broker rate limit"),
    (PackageIntegrityError("segment 3"), "package rejected (PackageIntegrityError)"),
    (PackageSignatureError("x"), "package rejected (PackageSignatureError)"),
    (httpx.ConnectError("refused"), "key broker unreachable"),
    (FileNotFoundError("/x/manifest.json"), "package or policy file missing"),
    (PolicyInvalid("bad"), "tenant policy or package metadata invalid"),
    (RuntimeError("boom: token abc"), "boot failed (RuntimeError)"),
])
def test_failure_reason_is_a_category_without_the_exception_text(exc: Exception, reason: str) -> None:
    assert failure_reason(exc) == reason
    assert str(exc) not in reason or not str(exc)
