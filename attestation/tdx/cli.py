"""Entry points for `sealed attest verify|inspect --tee tdx`: bytes in, JSON-able dict out."""

from __future__ import annotations

from typing import Any

from attestation import x509chain
from attestation.cli_request import VerifyRequest, check_report_data
from attestation.errors import PolicyViolation
from attestation.tdx.abi import parse_quote
from attestation.tdx.pck import pck_extensions
from attestation.tdx.pcs import collateral_from_items
from attestation.tdx.validate import Policy, to_claims, validate
from attestation.tdx.verify import INTEL_ROOT_FILE, TdxVerifier, VerifyOptions, ca_kind


def verify_for_cli(request: VerifyRequest) -> dict[str, Any]:
    """Verify a TDX quote and return its claims as JSON (tcb_status "Unknown" without collateral).

    `certs` are extra PEM chains (e.g. the TCB Signing chain) and join the collateral pile, which
    is sorted out by content. `nonce`, if given, is the expected REPORTDATA (zero-padded to 64
    bytes when shorter). Raises AttestationError subclasses; a bad policy dict or a failed policy
    raises PolicyViolation with every problem listed.
    """
    evidence, certs, collateral, policy = request.evidence, request.certs, request.collateral, request.policy
    try:
        parsed_policy = Policy.from_dict(policy) if policy is not None else None
    except (ValueError, TypeError) as exc:
        raise PolicyViolation([f"invalid TDX policy: {exc}"]) from exc
    quote = parse_quote(evidence)
    roots = x509chain.load_pinned_roots(INTEL_ROOT_FILE, request.roots_dir)
    verifier = TdxVerifier(roots, options=VerifyOptions(use_collateral=request.use_collateral))
    bundle = None
    if request.use_collateral:
        leaf, inter = quote.signature.pck_chain[0], quote.signature.pck_chain[1]
        bundle = collateral_from_items([*collateral, *certs], pck_extensions(leaf).fmspc, ca_kind(inter))
    verified = verifier.verify(quote, request.at, bundle)
    if request.nonce is not None:
        check_report_data(quote.body.report_data, request.nonce)
    if parsed_policy is not None:
        validate(verified, parsed_policy)
    out: dict[str, Any] = to_claims(verified).to_json()
    out["crls_checked"] = verified.crls_checked
    return out


def inspect_for_cli(evidence: bytes) -> dict[str, Any]:
    """Decode a TDX quote without verifying anything (the output says so)."""
    q = parse_quote(evidence)
    b, sig, qe = q.body, q.signature, q.signature.qe_report
    body = {
        name: getattr(b, name).hex()
        for name in (
            "tee_tcb_svn",
            "mr_seam",
            "mr_signer_seam",
            "seam_attributes",
            "td_attributes",
            "xfam",
            "mr_td",
            "mr_config_id",
            "mr_owner",
            "mr_owner_config",
            "report_data",
        )
    }
    body |= {f"rtmr{i}": r.hex() for i, r in enumerate(b.rtmrs)}
    if b.tee_tcb_svn2 is not None and b.mr_servicetd is not None:
        body |= {"tee_tcb_svn2": b.tee_tcb_svn2.hex(), "mr_servicetd": b.mr_servicetd.hex()}
    pck = pck_extensions(sig.pck_chain[0])
    return {
        "verified": False,
        "tee": "tdx",
        "header": {
            "version": q.header.version,
            "att_key_type": q.header.att_key_type,
            "tee_type": f"{q.header.tee_type:#x}",
            "qe_vendor_id": q.header.qe_vendor_id.hex(),
            "user_data": q.header.user_data.hex(),
            "body_type": q.body_type,
        },
        "body": body,
        "debug": b.debug,
        "qe_report": {
            "cpu_svn": qe.cpu_svn.hex(),
            "miscselect": qe.miscselect,
            "attributes": qe.attributes.hex(),
            "mr_enclave": qe.mr_enclave.hex(),
            "mr_signer": qe.mr_signer.hex(),
            "isv_prod_id": qe.isv_prod_id,
            "isv_svn": qe.isv_svn,
            "report_data": qe.report_data.hex(),
        },
        "qe_auth_data": sig.qe_auth_data.hex(),
        "pck": {
            "subjects": [c.subject.rfc4514_string() for c in sig.pck_chain],
            "fmspc": pck.fmspc.hex(),
            "pceid": pck.pceid.hex(),
            "pcesvn": pck.pcesvn,
            "cpusvn_components": list(pck.cpusvn_components),
            "sgx_type": pck.sgx_type,
        },
        "size": q.size,
        "trailing_bytes": q.trailing,
    }
