"""A client that pins a Sigstore publisher (identity + OIDC issuer + pinned trusted root), through
SealedOpenAI and `sealed verify`, against a real public bundle (tests/vectors/sigstore). The bundle
verifies but signs SLSA provenance, so it must be refused as "not reference values" before anything
is sent; the wrong identity, or the wrong form for the pin, is refused too."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from attestation.refvalues import NotReferenceValues, ReferenceValuesError
from attestation.sigstore_refvalues import SigstoreBundleError
from sealed_client import SealedOpenAI

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "sigstore"
BUNDLE = json.loads((VECTORS / "a.dsse.staging-rekor-v2.txt.sigstore.json").read_text())
IDENTITY = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
            "extremely-dangerous-oidc-beacon.yml@refs/heads/main")
ISSUER = "https://token.actions.githubusercontent.com"
JWKS: dict[str, Any] = {"keys": []}


def _policy(identity: str = IDENTITY, *, key: bool = False) -> dict[str, Any]:
    publisher: dict[str, Any] = (
        {"key": "11" * 32} if key else
        {"sigstore": {"identity": identity, "issuer": ISSUER,
                      "trusted_root": str(VECTORS / "staging.trusted_root.json")}})
    return {"tenant": "acme", "unsafe_no_tenant_key": True, "appraisal": {"allowed_tee": ["snp"]}, "broker_jwks": JWKS,
            "reference_values": {"publisher": publisher}}


@pytest.mark.parametrize(("case", "published", "policy", "error"), [
    ("real bundle, foreign predicate", BUNDLE, _policy(), NotReferenceValues),
    ("real bundle, other identity pinned", BUNDLE, _policy("https://github.com/acme/ops/.github/workflows/"
                                                           "publish.yml@refs/heads/main"), SigstoreBundleError),
    ("Sigstore pinned, bare DSSE envelope served", BUNDLE["dsseEnvelope"], _policy(), ReferenceValuesError),
    ("key pinned, Sigstore bundle served", BUNDLE, _policy(key=True), ReferenceValuesError),
    ("Sigstore pinned, nothing published", None, _policy(), ReferenceValuesError),
])
def test_sealed_openai_refuses_before_sending(case: str, published: Any, policy: dict[str, Any],
                                              error: type[Exception]) -> None:
    seen: list[str] = []

    def gateway(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.path)
        if request.url.path == "/.well-known/reference-values":
            return httpx2.Response(404, json={}) if published is None else httpx2.Response(200, json=published)
        if request.url.path == "/.well-known/attestation":
            return httpx2.Response(200, json={"workers": []})
        return httpx2.Response(500, json={"error": {"message": "must not be reached"}})

    client = SealedOpenAI(base_url="http://gw/v1", api_key="k", max_retries=0, policy=policy,
                          inner_transport=httpx2.MockTransport(gateway))
    with pytest.raises(error):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "secret"}])
    assert not [p for p in seen if p.startswith("/v1/")], (case, seen)


@pytest.fixture
def gateway_url() -> Iterator[str]:
    """A stand-in for the gateway's public documents (sealed verify speaks plain HTTP to it)."""
    documents = {"/.well-known/jwks.json": JWKS, "/.well-known/attestation": {"workers": []},
                 "/.well-known/reference-values": BUNDLE}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(documents.get(self.path, {})).encode()
            self.send_response(200 if self.path in documents else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_sealed_verify_names_the_sigstore_signer_and_fails_closed(gateway_url: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from api.cli.main import build

    policy = tmp_path / "client-policy.json"
    doc = _policy()
    doc["reference_values"]["publisher"]["sigstore"]["trusted_root"] = "staging.trusted_root.json"
    (tmp_path / "staging.trusted_root.json").write_bytes((VECTORS / "staging.trusted_root.json").read_bytes())
    policy.write_text(json.dumps(doc))  # the trusted root is found next to the policy
    result = CliRunner().invoke(build(), ["verify", gateway_url, "--policy", str(policy)])
    assert result.exit_code == 1
    assert "NotReferenceValues" in result.output and f"signed by sigstore {IDENTITY}" in result.output
    assert "slsa.dev/provenance" in result.output

    doc["reference_values"]["publisher"]["sigstore"]["identity"] = "someone@example.com"
    policy.write_text(json.dumps(doc))
    result = CliRunner().invoke(build(), ["verify", gateway_url, "--policy", str(policy)])
    assert result.exit_code == 1 and "SigstoreBundleError" in result.output
    assert "SANs do not match someone@example.com" in result.output
