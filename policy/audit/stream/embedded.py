"""Forwarding started by a component itself: with ``SEALED_AUDIT_FORWARD=FILE`` in its environment,
the gateway (its own log and the console's) and the key broker each forward their own audit logs,
in threads of their own, as `sealed audit forward` would (docs/siem.md, "Inside the components").

FILE is JSON; unknown keys are refused (a typo must not silently turn a destination off), and so is
a token in it (the HEC token comes from ``SEALED_AUDIT_HEC_TOKEN`` or a mode-600 ``token_file``)::

    {"syslog": {"address": "siem.example:6514", "ca": "/etc/sealed/siem-ca.pem",
                "cert": null, "key": null},
     "hec": {"url": "https://splunk.example:8088/services/collector/event", "ca": null,
             "token_file": "/etc/sealed/hec-token", "unsafe_plaintext": false},
     "hostname": "gw-1", "state_dir": null, "batch": 500, "poll_s": 1.0}

Each forwarded log keeps its cursors in ``STATE/<component>/`` (default ``AUDIT_DIR/forward``), so
two processes sharing an audit directory never write the same cursor file. The threads only read
the log files, so a collector that is down holds back nothing but its own cursor.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policy.audit.stream.errors import StreamConfigError
from policy.audit.stream.forwarder import Forwarder, ForwardSettings, Sender
from policy.audit.stream.hec import HecSender, HecTarget
from policy.audit.stream.settings import hec_token, host_port
from policy.audit.stream.syslog import SyslogSender, SyslogTarget

ENV = "SEALED_AUDIT_FORWARD"
log = logging.getLogger(__name__)
_TOP = {"syslog", "hec", "hostname", "state_dir", "batch", "poll_s"}
_SYSLOG = {"address", "ca", "cert", "key"}
_HEC = {"url", "ca", "token_file", "unsafe_plaintext"}


def _path(value: Any) -> Path | None:
    return None if value is None else Path(str(value))


def _only(section: str, doc: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise StreamConfigError(f"{ENV}: {section} must be an object")
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise StreamConfigError(f"{ENV}: unknown key(s) in {section}: {', '.join(unknown)}")
    return doc


@dataclass(frozen=True)
class ForwardConfig:
    syslog: SyslogTarget | None
    hec: HecTarget | None
    state_dir: Path | None = None
    batch: int = 500
    poll_s: float = 1.0

    @classmethod
    def from_file(cls, path: Path, environ: Mapping[str, str] | None = None) -> ForwardConfig:
        try:
            doc = _only("the file", json.loads(path.read_text("utf-8")), _TOP)
        except OSError as exc:
            raise StreamConfigError(f"{ENV}: cannot read {path}: {type(exc).__name__}") from None
        except ValueError:
            raise StreamConfigError(f"{ENV}: {path} is not JSON") from None
        hostname = str(doc.get("hostname", "-"))
        syslog = hec = None
        if doc.get("syslog") is not None:
            s = _only("syslog", doc["syslog"], _SYSLOG)
            if s.get("ca") is None:
                raise StreamConfigError(f"{ENV}: syslog needs ca (TLS is required)")
            host, port = host_port(str(s.get("address", "")))
            syslog = SyslogTarget(host, port, Path(str(s["ca"])), _path(s.get("cert")), _path(s.get("key")), hostname)
        if doc.get("hec") is not None:
            h = _only("hec", doc["hec"], _HEC)
            hec = HecTarget(str(h.get("url", "")), hec_token(_path(h.get("token_file")), environ),
                            _path(h.get("ca")), hostname if hostname != "-" else "sealed",
                            unsafe_plaintext=bool(h.get("unsafe_plaintext", False)))
        if syslog is None and hec is None:
            raise StreamConfigError(f"{ENV}: name a syslog and/or an hec destination")
        try:
            return cls(syslog, hec, _path(doc.get("state_dir")), int(doc.get("batch", 500)),
                       float(doc.get("poll_s", 1.0)))
        except (TypeError, ValueError):
            raise StreamConfigError(f"{ENV}: batch and poll_s must be numbers") from None

    def senders(self) -> list[Sender]:
        out: list[Sender] = []
        if self.syslog is not None:
            out.append(SyslogSender(self.syslog))
        if self.hec is not None:
            out.append(HecSender(self.hec))
        return out


class EmbeddedForwarding:
    """One component's logs forwarded by threads of its own process."""

    def __init__(self, config: ForwardConfig, logs: Mapping[str, Path]) -> None:
        """``logs``: component name -> the audit directory holding ``<component>.audit.jsonl``."""
        self.forwarders: list[Forwarder] = []
        for component, audit_dir in logs.items():
            state = (config.state_dir or audit_dir / "forward") / component
            settings = ForwardSettings(audit_dir, state, (component,), config.batch, config.poll_s)
            self.forwarders += [Forwarder(settings, sender) for sender in config.senders()]

    def start(self) -> EmbeddedForwarding:
        for forwarder in self.forwarders:
            forwarder.start()
        log.info("audit forwarding: %s", ", ".join(f"{f.settings.components[0]} -> {f.sender.name}"
                                                   for f in self.forwarders))
        return self

    def stop(self) -> None:
        for forwarder in self.forwarders:
            forwarder.stop()


def forwarding_from_env(logs: Mapping[str, Path], environ: Mapping[str, str] | None = None
                        ) -> EmbeddedForwarding | None:
    """Started forwarding of ``logs`` when ``SEALED_AUDIT_FORWARD`` names a config file, else None.
    A config that cannot be used raises StreamConfigError: the component does not start without the
    forwarding it was told to do."""
    env = os.environ if environ is None else environ
    path = env.get(ENV, "").strip()
    if not path:
        return None
    return EmbeddedForwarding(ForwardConfig.from_file(Path(path), env), logs).start()
