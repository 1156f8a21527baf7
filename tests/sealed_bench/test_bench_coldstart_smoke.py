"""`sealed bench coldstart` runs (CI smoke): a cold stack's phases, then a standby worker assigned and answering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealed_bench.bench_coldstart import main


def test_coldstart_reports_every_phase_cold_and_from_standby(tmp_path: Path) -> None:
    out = tmp_path / "coldstart.json"
    assert main(["--json", str(out)]) == 0
    report = json.loads(out.read_text())
    # A cold worker's own phases; "announce" too once the gateway has answered its ready heartbeat.
    assert {"boot", "broker", "attest", "release", "decrypt", "load"} <= set(report["cold_phases_s"])
    assert "assign" not in report["cold_phases_s"]
    assert set(report["standby_phases_s"]) == {"boot", "assign", "broker", "attest", "release", "decrypt", "load",
                                               "announce", "first_request", "first_token"}
    accounted = sum(s for phase, s in report["standby_phases_s"].items() if phase != "boot")
    assert report["standby_unaccounted_s"] == pytest.approx(
        report["standby_first_token_after_assignment_s"] - accounted, abs=0.002)
    assert report["standby_decrypt_and_load_s"] > 0 and report["standby_first_request_ttft_s"] > 0
    assert report["standby_first_token_after_assignment_s"] >= report["standby_assignment_to_ready_s"]
