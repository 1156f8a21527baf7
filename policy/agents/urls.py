"""Domain allowlists for fetch-like tools, written for adversarial input.

The model writing a tool call may be steered by a prompt injection, so every URL is treated as
hostile: parse strictly, refuse anything ambiguous (different parsers disagreeing is how
allowlists are bypassed), and compare canonical ASCII host names only.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import unquote, urlsplit

import idna

_ALLOWED_SCHEMES = frozenset({"https"})
_DEFAULT_PORTS = {"https": 443}
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+))*$")
MAX_URL = 2048
_UNSAFE_CHARS = re.compile(r"[\x00-\x20\x7f\\]")  # parsed differently by different clients


class UrlRejected(ValueError):
    """Why a URL was refused (the message is safe to return to the agent)."""


@functools.lru_cache(maxsize=4096)
def normalize_host(host: str) -> str:
    """Lower-case ASCII (punycode) form of a host name; raises UrlRejected when it is not one.

    Cached: allowlist entries and popular hosts repeat, and IDNA processing is the costliest step
    of a tool-call check. Plain ASCII names without punycode labels skip IDNA (UTS 46 maps ASCII
    to lower case and the label check below rejects everything else it would).
    """
    host = host.rstrip(".") if host.endswith(".") and not host.endswith("..") else host
    if not host or ".." in host or host.startswith("."):
        raise UrlRejected("empty label in host")
    if host.isascii() and "xn--" not in host.lower():
        ascii_host = host.lower()
    else:
        try:
            # UTS 46 folds case and width variants the way browsers do, then encodes punycode.
            ascii_host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise UrlRejected(f"host is not a valid IDNA name: {exc}") from exc
        ascii_host = ascii_host.lower()
    for label in ascii_host.split("."):
        if not _LABEL.match(label):
            raise UrlRejected("invalid host label")
    if _NUMERIC_HOST.match(ascii_host):
        raise UrlRejected("numeric host (IP literal in some notation)")
    return ascii_host


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def check_url(url: str, allowed_domains: frozenset[str]) -> str:
    """Return the canonical host when ``url`` may be fetched; raise UrlRejected otherwise.

    Allowlist entries: ``example.com`` (that host only) or ``*.example.com`` (strict subdomains).
    """
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise UrlRejected("URL missing or too long")
    if _UNSAFE_CHARS.search(url):
        # Whitespace, control characters and backslashes are parsed differently by different clients.
        raise UrlRejected("URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRejected(f"unparseable URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in _ALLOWED_SCHEMES:
        raise UrlRejected(f"scheme {scheme!r} not allowed")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise UrlRejected("userinfo in URL")
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        raise UrlRejected("non-default port")
    raw_host = parts.hostname or ""
    if "%" in parts.netloc:
        raise UrlRejected("percent-encoding in host")
    if _is_ip_literal(raw_host) or parts.netloc.startswith("["):
        raise UrlRejected("IP literal host")
    host = normalize_host(raw_host)
    path = unquote(unquote(parts.path))  # double decoding catches %252e%252e as well
    if any(seg in ("..", ".") for seg in re.split(r"[/\\]", path)):
        raise UrlRejected("dot segments in path")
    for entry in allowed_domains:
        wildcard = entry.startswith("*.")
        base = normalize_host(entry[2:] if wildcard else entry)
        if host == base and not wildcard:
            return host
        if wildcard and host.endswith("." + base):
            return host
    raise UrlRejected(f"host {host!r} is not on the allowlist")
