"""Collect a TDX quote inside a TD through configfs-tsm (Linux >= 6.7, tdx_guest driver)."""

from __future__ import annotations

from attestation.errors import FreshnessError, UnsupportedError
from attestation.tdx.abi import parse_quote
from attestation.tsm import TsmReportClient

TDX_PROVIDER = "tdx_guest"


def collect_quote(report_data: bytes, client: TsmReportClient | None = None) -> bytes:
    """A fresh quote whose REPORTDATA is `report_data` (64 bytes). The raw quote is returned.

    The quote is parsed before it is returned so a driver or QGS fault surfaces here, at the
    attester, rather than as a confusing verification failure at the relying party.
    """
    if len(report_data) != 64:
        raise ValueError("TDX REPORTDATA must be exactly 64 bytes")
    tsm = client or TsmReportClient()
    report = tsm.get_report(report_data)
    if report.provider != TDX_PROVIDER:
        raise UnsupportedError(f"configfs-tsm provider is {report.provider!r}, not {TDX_PROVIDER!r}")
    quote = parse_quote(report.outblob)
    if quote.body.report_data != report_data:
        raise FreshnessError("collected quote does not carry the requested REPORTDATA")
    return report.outblob
