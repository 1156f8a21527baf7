"""`sealed audit forward`: stream audit logs to a SIEM as OCSF events (docs/siem.md)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import typer

from api.home import Home, default_home
from policy.audit.stream.errors import StreamError
from policy.audit.stream.forwarder import Forwarder, ForwardSettings, Sender
from policy.audit.stream.hec import HecSender, HecTarget
from policy.audit.stream.settings import hec_token, host_port
from policy.audit.stream.syslog import SyslogSender, SyslogTarget


def forward(
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    directory: Path = typer.Option(None, "--dir", help="audit directory (default HOME/audit)"),
    state: Path = typer.Option(None, "--state", help="cursor directory (default DIR/forward)"),
    component: list[str] = typer.Option(None, "--component", help="forward only this component's log "
                                        "(gateway, key-broker, console; repeatable; default: every log)"),
    syslog: str = typer.Option(None, "--syslog", help="HOST:PORT of an RFC 5424 syslog receiver over TLS"),
    syslog_ca: Path = typer.Option(None, "--syslog-ca", help="CA certificate that signed the receiver's"),
    syslog_cert: Path = typer.Option(None, "--syslog-cert", help="client certificate (mutual TLS)"),
    syslog_key: Path = typer.Option(None, "--syslog-key", help="client key (mutual TLS)"),
    hec_url: str = typer.Option(None, "--hec-url", help="HTTP collector URL (Splunk HEC style), "
                                "e.g. https://splunk:8088/services/collector/event"),
    hec_ca: Path = typer.Option(None, "--hec-ca", help="CA certificate of the collector (default: system CAs)"),
    unsafe_hec_plaintext: bool = typer.Option(False, "--unsafe-hec-plaintext",
                                              help="UNSAFE: allow an http:// collector (events and token in clear)"),
    hec_token_file: Path = typer.Option(None, "--hec-token-file", help="file holding the HEC token "
                                        "(mode 600); else $SEALED_AUDIT_HEC_TOKEN. Never a flag value."),
    hostname: str = typer.Option("-", help="HOSTNAME field of syslog messages and host of HEC events"),
    batch: int = typer.Option(500, help="entries per batch"),
    poll: float = typer.Option(1.0, help="seconds between looks at the logs when idle"),
    once: bool = typer.Option(False, help="send what is there now and exit (1 if a destination failed)"),
) -> None:
    """Forward every audit entry, at least once and in order per log, to syslog and/or an HTTP collector."""
    audit_dir = directory or Home(home or default_home()).audit
    try:
        settings = ForwardSettings(audit_dir, state or audit_dir / "forward", tuple(component or ()), batch, poll)
        senders: list[Sender] = []
        if syslog:
            if syslog_ca is None:
                raise typer.BadParameter("--syslog needs --syslog-ca (TLS is required)")
            host, port = host_port(syslog)
            senders.append(SyslogSender(SyslogTarget(host, port, syslog_ca, syslog_cert, syslog_key, hostname)))
        if hec_url:
            senders.append(HecSender(HecTarget(hec_url, hec_token(hec_token_file), hec_ca,
                                               hostname if hostname != "-" else "sealed",
                                               unsafe_plaintext=unsafe_hec_plaintext)))
    except StreamError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not senders:
        raise typer.BadParameter("give --syslog and/or --hec-url")
    forwarders = [Forwarder(settings, s) for s in senders]
    if once:
        failed = False
        for f in forwarders:
            try:
                typer.echo(f"{f.sender.name}: {f.pump()} forwarded")
            except StreamError as exc:
                typer.echo(f"{f.sender.name}: {exc}", err=True)
                failed = True
        raise typer.Exit(1 if failed else 0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threads = [f.start() for f in forwarders]
    try:
        while not done.wait(1.0) and all(t.is_alive() for t in threads):
            pass
    except KeyboardInterrupt:
        pass
    for f in forwarders:
        f.stop()
    for t in threads:
        t.join()
