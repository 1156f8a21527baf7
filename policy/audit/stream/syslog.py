"""RFC 5424 syslog over TLS (RFC 5425) with octet-counted framing (RFC 6587 section 3.4.1).

Each message: ``<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [sealed@32473 ...] BOM{ocsf json}``,
facility 13 (log audit), severity 6 (informational) for allow and 4 (warning) for a refusal.

Syslog over TCP has no acknowledgement, so a batch counts as delivered only once the receiver has
read all of it: after the batch the forwarder sends TLS close_notify and waits for the receiver's
close_notify, which RFC 5425 section 4.4 requires it to send in reply (a receiver replies only after
reading to the end). Anything short of that is a DeliveryError and the batch is sent again (same
event ids). A bare TCP close is not a receipt: a receiver killed after reading the batch into its
memory but before storing it closes with a plain FIN (the kernel resets only while bytes are still
unread), which looks exactly like a receiver that read everything and skipped its close_notify.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from policy.audit.entry import AuditEntry, format_ts
from policy.audit.ocsf import ocsf_event
from policy.audit.stream.errors import DeliveryError, StreamConfigError

FACILITY_LOG_AUDIT = 13
SD_ID = "sealed@32473"  # 32473: the IANA enterprise number reserved for documentation (RFC 5612)
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SyslogTarget:
    host: str
    port: int
    ca_file: Path  # the CA that signed the receiver's certificate; the hostname is verified too
    client_cert: Path | None = None  # mutual TLS, where the receiver asks for it
    client_key: Path | None = None
    hostname: str = "-"  # HOSTNAME field: this host's name as the SIEM should show it
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.host or not 0 < self.port < 65536:
            raise StreamConfigError("syslog: a host and a port in 1..65535 are required")
        if not self.ca_file.is_file():
            raise StreamConfigError(f"syslog: CA file {self.ca_file} not found (TLS is required)")
        if (self.client_cert is None) != (self.client_key is None):
            raise StreamConfigError("syslog: a client certificate needs its key and the other way round")

    @property
    def name(self) -> str:
        return f"syslog-{self.host}-{self.port}"


def _sd_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def _token(value: str, limit: int) -> str:
    """A header field: printable US-ASCII without spaces, or the nil value."""
    text = "".join(c for c in value if 33 <= ord(c) <= 126)[:limit]
    return text or "-"


def format_message(entry: AuditEntry, hostname: str = "-") -> bytes:
    """One RFC 5424 message (without framing)."""
    severity = 6 if entry.decision == "allow" else 4
    pri = FACILITY_LOG_AUDIT * 8 + severity
    sd = (f'[{SD_ID} uid="{entry.hash}" seq="{entry.seq}" tenant="{_sd_value(entry.tenant)}" '
          f'decision="{_sd_value(entry.decision)}"]')
    header = (f"<{pri}>1 {format_ts(entry.ts)} {_token(hostname, 255)} {_token('sealed-' + entry.component, 48)} "
              f"- {_token(entry.action, 32)} {sd} ")
    body = json.dumps(ocsf_event(entry, raw=True), sort_keys=True, separators=(",", ":"))
    return header.encode("utf-8") + BOM + body.encode("utf-8")


def frame(message: bytes) -> bytes:
    """Octet counting: ``MSG-LEN SP SYSLOG-MSG``."""
    return str(len(message)).encode("ascii") + b" " + message


def _await_receipt(tls: ssl.SSLSocket, name: str) -> None:
    """Our close_notify, then the receiver's: the one sign that it read the batch to the end while
    alive (see the module docstring). A reset, a timeout or a bare close raises."""
    try:
        tls.unwrap()  # returns once the receiver's close_notify has arrived
    except ssl.SSLEOFError:
        raise DeliveryError(f"{name}: the receiver closed without its TLS close_notify (RFC 5425 section 4.4); "
                            "it may have died before storing the batch, which is sent again") from None


class SyslogSender:
    """Sends one batch per TLS connection and returns once the receiver has read it all."""

    def __init__(self, target: SyslogTarget) -> None:
        self.target = target
        self.name = target.name
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(target.ca_file))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if target.client_cert is not None and target.client_key is not None:
            ctx.load_cert_chain(str(target.client_cert), str(target.client_key))
        self._ctx = ctx

    def send(self, entries: Sequence[AuditEntry]) -> None:
        payload = b"".join(frame(format_message(e, self.target.hostname)) for e in entries)
        t = self.target
        try:
            with socket.create_connection((t.host, t.port), timeout=t.timeout_s) as raw, \
                    self._ctx.wrap_socket(raw, server_hostname=t.host) as tls:
                tls.sendall(payload)
                _await_receipt(tls, self.name)
        except ssl.SSLCertVerificationError as exc:
            raise DeliveryError(f"{self.name}: the receiver's certificate is not trusted ({exc.verify_message})") \
                from None
        except (OSError, ssl.SSLError) as exc:
            raise DeliveryError(f"{self.name}: {type(exc).__name__}: {exc}") from None
