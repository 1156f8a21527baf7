"""Security properties of the running stack: no plaintext on disk, refusal of unattested workers,
no content in logs, clean shutdown."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import httpx
import openai
import pytest

from api.broker_state import local_broker_keys
from api.home import Home
from api.stack import DEMO_MODEL, free_port, launch
from tests.api import plaintext_scan
from tests.api.conftest import copy_home

PROMPT = "Please name the capital city of France, zebra-quartz."


@pytest.fixture(scope="module")
def weight_needles() -> list[bytes]:
    """Bytes of known tensors as the worker holds them (fp32) and as the GGUF stores them."""
    return plaintext_scan.weight_needles()


def _files_written(stack: RunningStack) -> list[Path]:
    return [p for root in (stack.home, stack.tmpdir) for p in root.rglob("*") if p.is_file()]


def test_no_plaintext_weights_in_any_file_the_stack_wrote(stack: RunningStack, weight_needles: list[bytes]) -> None:
    files = _files_written(stack)
    assert any(p.name == "payload.bin" for p in files), "the scan must cover the encrypted package"
    for path in files:
        data = path.read_bytes()
        for needle in weight_needles:
            assert needle not in data, f"plaintext weight bytes found in {path}"


def test_no_plaintext_weights_in_files_the_stack_processes_hold_open(stack: RunningStack,
                                                                     weight_needles: list[bytes]) -> None:
    pids = json.loads((stack.home / "run" / "pids.json").read_text())
    scanned = 0
    for name, pid in pids.items():
        if isinstance(pid, int):
            opened = plaintext_scan.open_files(pid)
            scanned += len(opened)
            assert plaintext_scan.files_with_needles(opened, weight_needles) == [], name
    assert scanned > 0, "the scan must cover the processes' open files (logs at least)"


def test_logs_and_audit_hold_no_prompts_or_completions(stack: RunningStack) -> None:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    answer = client.chat.completions.create(model=DEMO_MODEL, messages=[{"role": "user", "content": PROMPT}],
                                            temperature=0, max_tokens=24).choices[0].message.content
    completion_words = [w for w in answer.split() if len(w) > 6]
    logs = [p for p in _files_written(stack) if p.suffix in (".log", ".jsonl")]
    assert logs, "expected process logs and audit logs"
    for path in logs:
        text = path.read_text(errors="replace")
        assert "zebra-quartz" not in text, f"prompt found in {path}"
        for word in completion_words:
            assert word not in text, f"completion text {word!r} found in {path}"


def test_no_key_material_in_logs(stack: RunningStack) -> None:
    secrets = [local_broker_keys(Home(stack.home)).master_key.hex(), stack.api_key]
    for path in _files_written(stack):
        if path.suffix in (".log", ".jsonl"):
            text = path.read_text(errors="replace")
            for secret in secrets:
                assert secret not in text, f"key material found in {path}"


@pytest.fixture(scope="module")
def refused_stack(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A second deployment whose worker presents a measurement the release policy does not allow."""
    root = tmp_path_factory.mktemp("refused")
    copy_home(stack.home, root)
    home = Home(root)
    home.create()
    running = launch(home, port=free_port(), unsafe_sim_measurement="ab" * 48)
    yield home, running
    running.stop()


def test_worker_with_unallowed_measurement_gets_no_key_and_gateway_says_unavailable(refused_stack) -> None:  # type: ignore[no-untyped-def]
    home, running = refused_stack
    assert running.wait_ready(timeout=120) == "failed"
    key = (home.root / "demo" / "api-key").read_text().strip()
    client = openai.OpenAI(base_url=f"{running.gateway_url}/v1", api_key=key, max_retries=0, timeout=30)
    # Not a hang: the client's own timeout would raise APITimeoutError, not a status error.
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=DEMO_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 503
    assert "model unavailable" in err.value.body["message"]
    entries = [json.loads(line) for line in (home.audit / "key-broker.audit.jsonl").read_text().splitlines()]
    assert any(e["action"] == "attest" and e["decision"] == "deny" and "measurement" in e["reason"]
               for e in entries)
    assert not any(e["action"] == "release" and e["decision"] == "allow" for e in entries)


def test_ctrl_c_stops_every_process(stack: RunningStack, tmp_path: Path, sealed_up) -> None:  # type: ignore[no-untyped-def]
    start_sealed_up, stop_sealed_up = sealed_up
    copy_home(stack.home, tmp_path / "home")
    running = start_sealed_up(tmp_path)
    pids = json.loads((running.home / "run" / "pids.json").read_text())
    assert stop_sealed_up(running) == 0
    for name in ("key-broker", "worker", "gateway"):
        with pytest.raises(ProcessLookupError):
            os.kill(pids[name], 0)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{running.url}/healthz", timeout=2)
