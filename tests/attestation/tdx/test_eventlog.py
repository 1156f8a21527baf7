"""RTMR replay from a real TDX CC event log equals the RTMRs of the quote taken on the same TD."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import build
from attestation.errors import ParseError
from attestation.tdx.abi import parse_quote
from attestation.tdx.eventlog import ccel_log_length, parse_cc_event_log, replay_rtmrs

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
LOG = VECTORS / "tdx-ccel" / "ccel_data.dat"
TABLE = VECTORS / "tdx-ccel" / "ccel_table.dat"
QUOTE = VECTORS / "attestation" / "tdx" / "gotdxguest_cos-113-tdx-quote.dat"
OTHER_QUOTE = VECTORS / "attestation" / "tdx" / "gotdxguest_tdx_prod_quote_SPR_E4.dat"


def test_replay_equals_the_quotes_rtmrs() -> None:
    events = parse_cc_event_log(LOG.read_bytes())
    assert len(events) == 43
    assert replay_rtmrs(events) == parse_quote(QUOTE.read_bytes()).body.rtmrs


def test_acpi_table_bounds_the_log() -> None:
    assert ccel_log_length(TABLE.read_bytes()) == len(LOG.read_bytes()) == 262144


def _first_event_offset(log: bytes) -> int:
    return 32 + struct.unpack_from("<I", log, 28)[0]  # SHA-1 header event: 4+4+20+4 bytes, then its data


def test_a_changed_digest_changes_the_replay() -> None:
    log = bytearray(LOG.read_bytes())
    digest_at = _first_event_offset(log) + 4 + 4 + 4 + 2  # index, type, count, algorithm id
    log[digest_at] ^= 1
    assert replay_rtmrs(parse_cc_event_log(bytes(log))) != parse_quote(QUOTE.read_bytes()).body.rtmrs


@pytest.mark.parametrize("mutate, message", [
    (lambda log: log[:40], "truncated"),
    (lambda log: log[:32] + b"Spec ID Event02\x00" + log[48:], "Spec ID Event03"),
    (lambda log: log[:_first_event_offset(log) + 8] + struct.pack("<I", 9999) + log[_first_event_offset(log) + 12:],
     "claims 9999 digests"),
    (lambda log: log[:_first_event_offset(log) + 12] + b"\x04\x00" + log[_first_event_offset(log) + 14:],
     "did not name"),
    (lambda log: log[:_first_event_offset(log)] + struct.pack("<I", 7) + log[_first_event_offset(log) + 4:],
     "not an RTMR"),
])
def test_malformed_logs_are_parse_errors(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError, match=message):
        replay_rtmrs(parse_cc_event_log(mutate(LOG.read_bytes())))


def test_not_a_ccel_table() -> None:
    with pytest.raises(ParseError, match="CCEL"):
        ccel_log_length(b"XCEL" + TABLE.read_bytes()[4:])


def test_cli_replays_and_checks_against_the_quote() -> None:
    runner = CliRunner()
    ok = runner.invoke(build(), ["measure", "tdx", "--ccel", str(LOG), "--acpi-table", str(TABLE),
                                 "--quote", str(QUOTE), "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert doc["quote_matches"] is True and doc["rtmrs"][0].startswith("3fa2f61f395b7f5f")
    wrong = runner.invoke(build(), ["measure", "tdx", "--ccel", str(LOG), "--quote", str(OTHER_QUOTE)])
    assert wrong.exit_code == 1
    assert "differ from the quote" in wrong.output
