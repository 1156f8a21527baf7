"""A real OpenID Provider for the single sign-on tests: panva's oidc-provider (OpenID Certified) run
under node from tests/support/oidc/ (`npm ci` there on first use: the npm registry must be
reachable; skipped with the reason where node or npm is missing).

The provider signs with an RSA key the test generates, so a test can also mint tokens with the
IdP's very key (and kid) but a wrong issuer, audience or expiry: each negative case differs from
a good token in exactly one thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from api.stack import free_port

HERE = Path(__file__).resolve().parents[1] / "support" / "oidc"
AUDIENCE = "https://sealed.test/management"
CONSOLE_CLIENT = "sealed-console"
CONSOLE_SECRET = "console-secret-" + "c" * 32
REDIRECT_URI = "https://testserver/console/oidc/callback"
POST_LOGOUT_URI = "https://testserver/console/login"
MACHINE_SECRET = "machine-secret-" + "m" * 32


@dataclass
class Idp:
    issuer: str
    key: rsa.RSAPrivateKey
    kid: str
    log: Path
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)

    def client_credentials(self, client_id: str) -> str:
        """An access token for the management API, as automation gets one (client credentials grant)."""
        r = httpx.post(self.issuer + "/token", data={"grant_type": "client_credentials", "resource": AUDIENCE,
                                                    "scope": "manage"},
                       auth=(client_id, MACHINE_SECRET), timeout=10)
        assert r.status_code == 200, r.text
        token: str = r.json()["access_token"]
        return token

    def set_claims(self, subject: str, claims: dict[str, Any]) -> None:
        """What the IdP says about an account or client from now on (an administrator's change)."""
        r = httpx.put(f"{self.issuer}/test/claims/{subject}", content=json.dumps(claims), timeout=10)
        assert r.status_code == 204, r.text

    def mint(self, *, key: Any = None, alg: str = "RS256", kid: str | None = None, **claims: Any) -> str:
        """A token signed with the IdP's own key (unless told otherwise), good except where ``claims`` say."""
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "minted", "iat": now, "exp": now + 600,
                "jti": os.urandom(8).hex(), "groups": ["sealed-operators"]}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key if key is not None else self.key, algorithm=alg,
                          headers={"kid": kid if kid is not None else self.kid})


def _clients(redirect_uris: tuple[str, ...]) -> list[dict[str, Any]]:
    machine = [{"client_id": c, "client_secret": MACHINE_SECRET, "grant_types": ["client_credentials"],
                "redirect_uris": [], "response_types": []}
               for c in ("automation", "acme-bot", "globex-bot", "auditor-bot", "no-role-bot")]
    return [{"client_id": CONSOLE_CLIENT, "client_secret": CONSOLE_SECRET,
             "redirect_uris": [REDIRECT_URI, *redirect_uris], "post_logout_redirect_uris": [POST_LOGOUT_URI],
             "grant_types": ["authorization_code"], "response_types": ["code"]}, *machine]


CLAIMS: dict[str, dict[str, Any]] = {
    # accounts (console users) and clients (automation)
    "alice": {"groups": ["sealed-operators"]},
    "tam": {"groups": ["tenant-admins", "staff"], "tenant": "acme"},
    "audrey": {"groups": ["sealed-auditors"]},
    "nobody": {"groups": ["staff"]},
    "automation": {"groups": ["sealed-operators"]},
    "acme-bot": {"groups": ["tenant-admins"], "tenant": "acme"},
    "globex-bot": {"groups": ["globex-admins"]},
    "auditor-bot": {"groups": ["sealed-auditors"]},
    "no-role-bot": {},
}


def _npm_install() -> None:
    missing = None
    if shutil.which("node") is None or shutil.which("npm") is None:
        missing = "single sign-on tests need node and npm (they run the oidc-provider package)"
    else:
        version = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
        if (major, minor) < (20, 19):
            missing = f"oidc-provider needs node 20.19 or later, not {version}"
    if missing is not None:
        if os.environ.get("SEALED_REQUIRE_NODE") == "1":  # CI: a skip would hide the tests
            pytest.fail(missing)
        pytest.skip(missing)
    if (HERE / "node_modules" / "oidc-provider").is_dir():
        return
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=HERE,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"npm ci in {HERE} failed:\n{done.stdout}\n{done.stderr}"


@contextlib.contextmanager
def running_idp(root: Path, redirect_uris: tuple[str, ...] = ()) -> Iterator[Idp]:
    _npm_install()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = "idp-key-1"
    private = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    private.update(kid=kid, use="sig", alg="RS256")
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    claims = json.loads(json.dumps(CLAIMS))
    config = {"port": port, "issuer": issuer, "audience": AUDIENCE, "jwks": {"keys": [private]},
              "clients": _clients(redirect_uris), "claims": claims}
    root.mkdir(parents=True, exist_ok=True)
    log = root / "oidc-provider.log"
    env = {**os.environ, "SEALED_TEST_OIDC": json.dumps(config), "NODE_ENV": "test"}
    with log.open("w") as out:
        proc = subprocess.Popen(["node", "provider.mjs"], cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while True:  # ready when discovery answers (or the process died)
            assert proc.poll() is None, f"oidc-provider exited:\n{log.read_text()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(issuer + "/.well-known/openid-configuration", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield Idp(issuer, key, kid, log, claims)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_FORM = re.compile(r'<form[^>]*action="([^"]+)"', re.I)
_INPUT = re.compile(r"<input[^>]*>", re.I)
_NAME = re.compile(r'\bname="([^"]*)"')
_VALUE = re.compile(r'\bvalue="([^"]*)"')


def _fields(page: str) -> dict[str, str]:
    out = {}
    for tag in _INPUT.findall(page):
        name, value = _NAME.search(tag), _VALUE.search(tag)
        if name is not None:
            out[unescape(name.group(1))] = unescape(value.group(1)) if value is not None else ""
    return out


def idp_login(idp_browser: httpx.Client, authorize_url: str, account: str) -> str:
    """Drive the IdP's own login pages as a browser would (its dev interactions: any password),
    following its redirects, until it sends the browser back to the console; that URL."""
    url = authorize_url
    for _ in range(20):
        r = idp_browser.get(url)
        while r.is_redirect:
            url = urljoin(str(r.url), r.headers["location"])
            if url.startswith(REDIRECT_URI) or url.startswith(POST_LOGOUT_URI):
                return url
            r = idp_browser.get(url)
        action = _FORM.search(r.text)
        assert action is not None, f"no form on the IdP's page {r.url}:\n{r.text[:2000]}"
        fields = _fields(r.text)
        if "login" in fields:
            fields.update(login=account, password="any")
        r = idp_browser.post(urljoin(str(r.url), unescape(action.group(1))), data=fields)
        assert r.is_redirect, f"the IdP did not accept the form at {r.url}: {r.status_code}\n{r.text[:2000]}"
        url = urljoin(str(r.url), r.headers["location"])
        if url.startswith(REDIRECT_URI) or url.startswith(POST_LOGOUT_URI):
            return url
    raise AssertionError("the IdP never sent the browser back")
