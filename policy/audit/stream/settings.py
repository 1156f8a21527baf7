"""What a forwarder is told: destinations from flags, the HEC token from the environment or a file.

The token never comes from argv (visible in ``ps`` to every user of the host): ``SEALED_AUDIT_HEC_TOKEN``
or a file readable only by its owner.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from policy.audit.stream.errors import StreamConfigError

TOKEN_ENV = "SEALED_AUDIT_HEC_TOKEN"


def hec_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str:
    """The HEC token: from ``token_file`` (mode 0600 or stricter), else from SEALED_AUDIT_HEC_TOKEN."""
    env = os.environ if environ is None else environ
    if token_file is not None:
        try:
            info = token_file.stat()
        except OSError:
            raise StreamConfigError(f"hec: token file {token_file} not found") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise StreamConfigError(f"hec: token file {token_file} is readable by others (chmod 600)")
        token = token_file.read_text("utf-8").strip()
    else:
        token = env.get(TOKEN_ENV, "").strip()
    if not token:
        raise StreamConfigError(f"hec: no token (set {TOKEN_ENV} or --hec-token-file)")
    return token


def host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise StreamConfigError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)
