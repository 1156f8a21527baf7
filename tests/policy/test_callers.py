"""The tenant's caller list (policy/callers.py): parsing is strict and default-deny, and a signed
policy set carries it through the signature unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.callers import CallerPolicy, CallerRefused, api_key_digest
from policy.documents import sign_policy_document, verify_policy_document
from policy.errors import PolicyInvalid
from policy.policyset import PolicySet
from protocol.sealed import api_key_id

OWN = "sk-sealed-tenant-own"
JWKS = {"keys": [{"kty": "EC", "crv": "P-256", "kid": "k", "alg": "ES256",
                  "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                  "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}
IDP = {"issuer": "https://idp.example", "audience": "sealed", "jwks": JWKS}


@pytest.mark.parametrize("section, why", [
    ("keys", "callers names only"),
    ({"api_keys": "abc"}, "hex SHA-256"),
    ({"api_keys": ["AB" * 32]}, "hex SHA-256"),  # upper case: not the digest as listed
    ({"api_keys": [api_key_digest(OWN)[:63]]}, "hex SHA-256"),
    ({"api_keys": [OWN]}, "hex SHA-256"),  # a secret instead of its digest
    ({"unsafe_operator_keys": "yes"}, "true or false"),
    ({"operator_keys": True}, "callers names only"),
    ({"oidc": {"issuer": "x"}}, "oidc is a list"),
    ({"oidc": [{**IDP}]}, "exactly one of subject or group"),
    ({"oidc": [{**IDP, "subject": "a", "group": "g"}]}, "exactly one of subject or group"),
    ({"oidc": [{**IDP, "subject": 7}]}, "exactly one of subject or group"),
    ({"oidc": [{**IDP, "jwks": {"keys": [{"kty": "nope"}]}, "subject": "a"}]}, "not a usable JWKS"),
    ({"oidc": [{"issuer": "x", "jwks": JWKS, "subject": "a"}]}, "names issuer, audience, jwks"),
])
def test_a_malformed_caller_section_is_refused(section: Any, why: str) -> None:
    with pytest.raises(PolicyInvalid, match=why):
        PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme", "callers": section})


def test_the_signed_caller_list_round_trips_and_decides() -> None:
    admin = Ed25519PrivateKey.generate()
    doc = {"policy_id": "p", "version": 1, "tenant": "acme",
           "callers": {"api_keys": [api_key_digest(OWN)], "oidc": [{**IDP, "group": "ml"}]}}
    envelope = sign_policy_document(doc, admin, "admin")
    callers = verify_policy_document(envelope, {"acme": {"admin": admin.public_key()}}).callers
    assert callers is not None and not callers.unsafe_operator_keys
    callers.check_key_id(api_key_id(OWN))
    with pytest.raises(CallerRefused, match=r"callers\.api_keys"):
        callers.check_key_id(api_key_id("sk-sealed-operator-made"))
    assert callers.check_sealed(OWN, "", api_key_id(OWN)) == "api_key"
    with pytest.raises(CallerRefused, match="not the API key the request was sent with"):
        callers.check_sealed(OWN, "", api_key_id("sk-sealed-operator-made"))
    with pytest.raises(CallerRefused, match="no caller credential"):
        callers.check_sealed("", "", api_key_id(OWN))
    with pytest.raises(CallerRefused, match="caller policy"):
        callers.check_sealed("sk-sealed-operator-made", "not.a.jwt", api_key_id("sk-sealed-operator-made"))
    # A policy set without the section has not decided; with an empty one, no key is a caller.
    assert PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme"}).callers is None
    empty = CallerPolicy.from_dict({})
    with pytest.raises(CallerRefused):
        empty.check_key_id(api_key_id(OWN))
    CallerPolicy.from_dict({"unsafe_operator_keys": True}).check_key_id(api_key_id("sk-sealed-operator-made"))


def test_the_cli_prints_the_digest_a_caller_list_names(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from api.cli.manage import build_apikeys

    (tmp_path / "key").write_text(OWN + "\n")
    result = CliRunner().invoke(build_apikeys(), ["digest", str(tmp_path / "key")])
    assert result.exit_code == 0 and result.output.strip() == api_key_digest(OWN)
