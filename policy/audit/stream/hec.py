"""A Splunk HTTP Event Collector-style destination: a batch is one POST of concatenated JSON events.

``POST {url}`` with ``Authorization: Splunk <token>``; each event is
``{"time", "host", "source": "sealed:<component>", "sourcetype": "ocsf:api_activity", "event": <OCSF>,
"fields": {"event_id": <chain hash>, "seq": n}}``. A batch is acknowledged by HTTP 200 (and, where the
body is JSON, ``"code": 0``); anything else is a DeliveryError and the batch is sent again.
The token comes from the environment or a file, never from argv (settings.py).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from policy.audit.entry import AuditEntry
from policy.audit.ocsf import ocsf_event
from policy.audit.stream.errors import DeliveryError, StreamConfigError

SOURCETYPE = "ocsf:api_activity"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HecTarget:
    url: str
    token: str = field(repr=False)
    ca_file: Path | None = None  # verify the collector against this CA (else the system's)
    host: str = "sealed"
    timeout_s: float = 10.0
    unsafe_plaintext: bool = False  # allow http:// (audit and the token in clear on the network)

    def __post_init__(self) -> None:
        if not self.url.startswith(("https://", "http://")):
            raise StreamConfigError("hec: the URL must be https:// (http:// only with unsafe_plaintext)")
        if self.url.startswith("http://"):
            if not self.unsafe_plaintext:
                raise StreamConfigError("hec: the URL must be https:// (http:// only with --unsafe-hec-plaintext)")
            log.warning("UNSAFE: audit events and the HEC token go to %s in clear", self.url)
        if not self.token:
            raise StreamConfigError("hec: a token is required")
        if self.ca_file is not None and not self.ca_file.is_file():
            raise StreamConfigError(f"hec: CA file {self.ca_file} not found")

    @property
    def name(self) -> str:
        return "hec-" + "".join(c if c.isalnum() else "-" for c in self.url.split("://", 1)[1])[:80]


def hec_event(entry: AuditEntry, host: str) -> dict[str, object]:
    return {"time": round(entry.ts.timestamp(), 3), "host": host, "source": f"sealed:{entry.component}",
            "sourcetype": SOURCETYPE, "event": ocsf_event(entry, raw=True),
            "fields": {"event_id": entry.hash, "seq": entry.seq}}


class HecSender:
    def __init__(self, target: HecTarget) -> None:
        self.target = target
        self.name = target.name
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(target.ca_file))
                                         if target.ca_file is not None else True)
        self._client = httpx.Client(verify=verify, timeout=target.timeout_s,
                                    headers={"Authorization": f"Splunk {target.token}",
                                             "Content-Type": "application/json"})

    def send(self, entries: Sequence[AuditEntry]) -> None:
        body = "".join(json.dumps(hec_event(e, self.target.host), sort_keys=True, separators=(",", ":"))
                       for e in entries)
        try:
            reply = self._client.post(self.target.url, content=body.encode("utf-8"))
        except httpx.HTTPError as exc:
            raise DeliveryError(f"{self.name}: {type(exc).__name__}") from None
        if reply.status_code != 200:
            raise DeliveryError(f"{self.name}: HTTP {reply.status_code}")
        try:
            code = reply.json().get("code", 0)
        except (ValueError, AttributeError):
            code = 0
        if code != 0:
            raise DeliveryError(f"{self.name}: collector answered code {code}")

    def close(self) -> None:
        self._client.close()
