"""The worker checks, itself, that its key was released under a policy its tenant signed.

Authenticating the broker (enclave_worker/broker_auth.py) proves it runs the genuine broker code;
it does not prove it holds the tenant's state. An operator can start a second copy of the genuine
broker with state of its own: its own data key for a package it built, and a release policy it
wrote naming its own signer. That copy's evidence, token and receipt all verify. What it cannot
make is the tenant's signature: the broker hands the tenant-signed release-policy envelope over
with each key, and the worker verifies it with the policy-admin key it is measured with
(`--policy-admin-key`, the key that also signs its in-enclave policy), then requires the receipt
to name that policy's id and version and, where the tenant pins one, its package signer.

A genuine broker only moves a policy's version forward, but its sealed state file is on the
operator's disk: sealing keeps it secret, not fresh, so an older copy of the state (an older, still
tenant-signed policy that admitted more) can be put back. The worker's floor
(`--min-release-policy-version`, measured) refuses any release policy older than the tenant asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policy.documents import check_envelope_signature, envelope_parts
from policy.errors import PolicyError
from policy.release import ReleasePolicy
from policy.release_documents import REFERENCE_KEY, RELEASE_DOMAIN, load_admin_public_key
from protocol.broker.errors import BrokerNotAuthenticated
from protocol.model_ref import ModelRef


def check_tenant_release_policy(envelope: Mapping[str, Any] | None, admin_key: Path, ref: ModelRef,
                                receipt: Mapping[str, Any], min_version: int = 0) -> ReleasePolicy:
    """The release policy the (verified) receipt names, signed by the tenant; else BrokerNotAuthenticated."""
    if envelope is None:
        raise BrokerNotAuthenticated("the key answer carries no tenant-signed release policy")
    try:
        payload, _ = envelope_parts(envelope)
        check_envelope_signature(envelope, load_admin_public_key(admin_key.read_text()), RELEASE_DOMAIN)
        policy = ReleasePolicy.from_dict({k: v for k, v in payload.items() if k != REFERENCE_KEY})
    except (PolicyError, OSError, ValueError) as exc:
        raise BrokerNotAuthenticated(f"the release policy is not signed by this worker's tenant: {exc}") from exc
    if (policy.tenant, policy.model) != (ref.tenant, ref.model) or policy.model_version not in (None, ref.version):
        raise BrokerNotAuthenticated("the tenant-signed release policy is for another model")
    if policy.version < min_version:
        raise BrokerNotAuthenticated(f"the tenant-signed release policy (version {policy.version}) is older than "
                                     f"this worker's floor (version {min_version})")
    if (policy.policy_id, policy.version) != (receipt.get("policy_id"), receipt.get("policy_version")):
        raise BrokerNotAuthenticated("the receipt names another release policy than the tenant signed")
    if policy.required_signer is not None and receipt.get("signer") != policy.required_signer:
        raise BrokerNotAuthenticated("the released key is for a package signer the tenant's policy does not name")
    return policy
