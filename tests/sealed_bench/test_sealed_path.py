"""`sealed bench sealed-path` (sealed_bench/bench_sealed_path.py): its JSON report's format, its
arithmetic, and that what it times in sealed mode is a real sealed exchange (the answer opens, its
receipt verifies and counts the tokens asked for). A tiny random-weight model: the path, not speed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from protocol.sealed import verify_receipt
from protocol.sealed.http import ResponseHead
from sealed_bench.bench_sealed_path import SCHEMA, load_engine, main, report
from sealed_bench.sealed_path import API_KEY_ID, MODEL, MODES, TENANT, PathWorker, bench_state

FIELDS = {"cpu_ms_per_request", "loop_cpu_ms_per_request", "engine_steps", "ttft_ms_p50"}


@pytest.fixture(scope="module", autouse=True)
def _default_model() -> None:
    from enclave_worker.engine.checkpoint import default_gguf_path

    try:
        default_gguf_path()
    except Exception as exc:  # the prompts' tokenizer is the installed default model's
        pytest.skip(f"default model not installed: {exc}")


def test_the_json_report_has_every_mode_every_run_and_the_costs(tmp_path: Path) -> None:
    out = tmp_path / "sealed-path.json"
    assert main(["--arch", "tiny", "--requests", "2", "--concurrency", "2", "--rounds", "1", "--input-len", "16",
                 "--output-len", "4", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA
    assert doc["conditions"] == {"arch": "tiny", "requests": 2, "concurrency": 2, "rounds": 1, "input_len": 16,
                                 "output_len": 4, "threads": 1, "seed": 0}
    assert {"cpu", "cpus", "python", "system"} <= set(doc["machine"]) and len(doc["date"]) == 10
    assert sorted((r["round"], r["mode"]) for r in doc["runs"]) == sorted((n, m) for n in (1,) for m in MODES)
    for run in doc["runs"]:
        assert run["requests"] == 2 and run["engine_steps"] > 0
        assert run["cpu_ms_per_request"] > 0 and run["loop_cpu_ms_per_request"] > 0 and run["ttft_ms_p50"] > 0
    # At most a chunk a token (a consumer that falls behind gets tokens merged); the OpenAI layer adds
    # the usage event and [DONE], sealed mode the receipt (the head rides with the first event).
    chunks = {r["mode"]: r["chunks_per_request"] for r in doc["runs"]}
    assert 1 <= chunks["plaintext"] <= 4 and 3 <= chunks["openai"] <= 6 and 4 <= chunks["sealed"] <= 7
    assert set(doc["modes"]) == set(MODES) and all(set(v) == FIELDS for v in doc["modes"].values())
    assert set(doc["cost_over_plaintext"]) == {"openai", "sealed"}


def test_costs_are_each_modes_median_less_plaintexts() -> None:
    def run(mode: str, cpu: float, steps: int) -> dict[str, object]:
        return {"mode": mode, "cpu_ms_per_request": cpu, "loop_cpu_ms_per_request": cpu / 10,
                "engine_steps": steps, "ttft_ms_p50": cpu / 100}

    runs = [run("plaintext", 100.0, 10), run("plaintext", 120.0, 10), run("plaintext", 300.0, 12),
            run("sealed", 110.0, 10), run("sealed", 150.0, 11), run("sealed", 131.0, 10)]
    doc = report(runs)
    assert doc["modes"]["plaintext"]["cpu_ms_per_request"] == 120.0
    assert doc["cost_over_plaintext"] == {"sealed": {"cpu_ms_per_request": 11.0, "loop_cpu_ms_per_request": 1.1,
                                                     "engine_steps": 0, "ttft_ms_p50": 0.11}}
    assert report([run("sealed", 1.0, 1)])["cost_over_plaintext"] == {}  # nothing to compare against


def test_the_timed_sealed_request_is_a_whole_sealed_exchange() -> None:
    state = bench_state(load_engine("tiny", 1))
    worker = PathWorker(state, output_len=5, keep=True)
    timed = asyncio.run(worker.send("sealed", "hello there, how are you", "rq-1"))
    chunks, client = worker.kept["rq-1"]
    assert client is not None and timed.chunks == len(chunks)
    parts = [p for c in chunks for p in client.opener.feed(c.data)]
    client.opener.close()  # raises if the answer was cut short
    plain, (receipt_frame, final) = [p for p, _ in parts[:-1]], parts[-1]
    assert final and ResponseHead.decode(plain[0]).status == 200
    events = [json.loads(p[6:]) for p in plain[1:] if p != b"data: [DONE]\n\n"]
    assert events[-1]["usage"]["completion_tokens"] == 5
    receipt = verify_receipt(receipt_frame, bytes.fromhex(state.usage_public_hex),
                             request_sha256=client.request_sha256, response_sha256=client.opener.hash.hexdigest(),
                             worker_key_id=state.serving_key.key_id, model=MODEL, tenant=TENANT,
                             api_key_id=API_KEY_ID)
    assert receipt.completion_tokens == 5
    with pytest.raises(ValueError, match="unknown mode"):
        asyncio.run(worker.send("plain", "x", "rq-2"))
