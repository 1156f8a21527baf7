"""Audit streaming: every audit log forwarded as OCSF events to a SIEM (RFC 5424 syslog over TLS,
Splunk HEC-style HTTP), at least once, resuming from a durable cursor per destination.

The forwarder tails the log files the components already write; it never sits in a request's
path, so a slow or absent collector cannot block serving (docs/siem.md).
"""
