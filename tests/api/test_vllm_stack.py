"""`sealed up --engine vllm`: the same stack and the same OpenAI conformance checks, with the
encrypted default model served by vLLM inside the worker (docs/vllm-backend.md).

One stack for the module (vLLM is heavy); the conformance, in-enclave policy, sealed-mode,
structured-output, streamed tool call and log tests are our engine's own, imported and run against
it; the acceptance suite of JSON schemas goes through the API in every mode. The last test revokes
the tenant's key: the worker wipes vLLM's weights and KV cache, and its memory holds no plaintext
weight bytes afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any as RunningStack

import httpx
import openai
import pytest

from api.stack import DEMO_MODEL, DEMO_TENANT
from tests.api.conftest import start_sealed_up, stop_sealed_up
from tests.api.plaintext_scan import files_with_needles, memory_with_needles, open_files, weight_needles
from tests.api.test_enclave_policy import (  # noqa: F401 (collected here, against the vLLM stack)
    test_a_tool_call_cut_off_by_max_tokens_is_checked_like_a_whole_one,
    test_prompt_with_blocked_pii_is_refused_inside_the_worker,
    test_tool_outside_the_agents_allowlist_is_refused_before_the_answer_leaves,
)
from tests.api.test_openai_e2e import (  # noqa: F401
    test_missing_api_key_is_401_in_openai_shape,
    test_models_lists_the_tenants_model,
    test_non_streamed_chat_and_completion,
    test_streamed_greedy_chat_answers_paris_with_usage_in_final_chunk,
)
from tests.api.test_openai_features import (  # noqa: F401
    test_chat_logprobs_streaming_and_not,
    test_client_disconnect_cancels_the_request_in_the_engine,
    test_completions_logprobs_echo_and_streaming_usage,
    test_forced_tool_call_is_parsed_into_tool_calls,
    test_json_mode_returns_a_json_object,
    test_json_schema_and_tool_arguments_are_enforced_while_decoding,
    test_n_seed_and_stop,
    test_usage_endpoint_and_metrics,
)
from tests.api.test_sealed_e2e import (  # noqa: F401
    plain,
    sealed,
    test_receipt_counts_match_the_usage_the_client_sees,
    test_sealed_answers_exactly_as_plaintext,
)
from tests.api.test_stack_security import (  # noqa: F401
    test_logs_and_audit_hold_no_prompts_or_completions,
    test_no_key_material_in_logs,
)
from tests.api.test_streamed_tool_calls import (  # noqa: F401
    test_a_forbidden_tool_is_refused_before_any_byte_of_its_call_reaches_the_client,
    test_auto_tool_choice_streamed_is_the_non_streamed_message,
    test_the_sdks_stream_accumulation_gives_the_non_streamed_calls,
)
from tests.enclave_worker.schema_suite import MAX_TOKENS, SCHEMAS, ask, valid

pytestmark = pytest.mark.vllm
MODES = [(is_sealed, stream) for is_sealed in (False, True) for stream in (False, True)]


def test_the_schema_suite_through_the_api_plaintext_and_sealed_streamed_and_not(stack: RunningStack) -> None:
    """Every schema of the acceptance suite at temperature 1 through vLLM's structured outputs, each in
    one of the four modes in turn (so each mode gets 8 or 9 schemas), eight at a time: every answer
    complete and valid. (All 33 in all four modes is the engine-level suite's job, test_vllm_engine.py;
    this bounds the stack's share on two CPU cores.)"""
    clients = {False: plain(stack), True: sealed(stack)}

    def one(i: int) -> tuple[str, str, str | None, tuple[bool, bool]]:
        (what, schema), (is_sealed, stream) = SCHEMAS[i], MODES[i % len(MODES)]
        args: dict = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": ask(what)}],
                      "temperature": 1.0, "seed": i, "max_tokens": MAX_TOKENS, "response_format": {
                          "type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}
        api = clients[is_sealed].chat.completions
        if not stream:
            choice = api.create(**args).choices[0]
            return what, choice.message.content or "", choice.finish_reason, (is_sealed, stream)
        chunks = [c for c in api.create(**args, stream=True) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        return what, text, chunks[-1].choices[0].finish_reason, (is_sealed, stream)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(len(SCHEMAS))))
    bad = [a for a, (_, schema) in zip(answers, SCHEMAS, strict=True) if a[2] != "stop" or not valid(a[1], schema)]
    assert not bad, bad
    assert {a[3] for a in answers} == set(MODES)


@pytest.fixture(scope="module")
def stack(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """Overrides the session's (our engine's) stack for this module."""
    running = start_sealed_up(tmp_path_factory.mktemp("vllm-stack"), timeout=900.0, args=("--engine", "vllm"))
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)


@pytest.fixture(scope="module")
def needles() -> list[bytes]:
    return weight_needles()


def _pids(stack: RunningStack) -> dict:
    return json.loads((stack.home / "run" / "pids.json").read_text())


def test_the_worker_serves_with_vllm_from_its_own_interpreter(stack: RunningStack, vllm_python: str) -> None:
    pid = _pids(stack)["worker"]
    assert Path(f"/proc/{pid}/exe").resolve() == Path(vllm_python).resolve()
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "/vllm/" in maps  # vLLM's own extension is loaded in the worker process
    status = httpx.get(f"{_pids(stack)['worker_url']}/internal/status").json()
    assert status["status"] == "ready" and status["stats"]["block_size"] >= 1


def test_no_plaintext_weights_in_files_written_or_open_in_the_worker(stack: RunningStack,
                                                                     needles: list[bytes]) -> None:
    written = [p for root in (stack.home, stack.tmpdir) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "payload.bin" for p in written), "the scan must cover the encrypted package"
    assert files_with_needles(written, needles) == []
    for name, pid in _pids(stack).items():
        if isinstance(pid, int):
            opened = open_files(pid)
            assert files_with_needles(opened, needles) == [], name


def test_tenant_salts_keep_prefix_caches_apart(stack: RunningStack) -> None:
    """The same long prompt twice hits the cache for the tenant that sent it (vLLM counts hit tokens)."""
    worker = _pids(stack)["worker_url"]
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)
    c = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0, timeout=120)
    before = httpx.get(f"{worker}/internal/status").json()["stats"]["prefix_cache_hit_tokens"]
    for _ in range(2):
        c.completions.create(model=DEMO_MODEL, prompt=long_prompt, max_tokens=1, temperature=0)
    after = httpx.get(f"{worker}/internal/status").json()["stats"]["prefix_cache_hit_tokens"]
    assert after - before >= 128  # at least one full vLLM block of the repeat came from the cache


def test_vllm_metrics_are_exported_by_the_gateway_under_their_vllm_names(stack: RunningStack) -> None:
    from api.management.auth import issue_token

    operator = issue_token((stack.home / "gateway" / "jwt-secret").read_text().strip(), "test", "operator")
    deadline = time.monotonic() + 30
    while True:  # the next heartbeat carries the engine's figures
        text = httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {operator}"}).text
        if "vllm:prompt_tokens{" in text or time.monotonic() > deadline:
            break
        time.sleep(1)
    for name in ("vllm:num_requests_running", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:kv_cache_usage_perc"):
        assert f"{name}{{" in text, name


def test_revocation_wipes_vllm_and_no_weight_bytes_stay_in_the_worker(stack: RunningStack,
                                                                       needles: list[bytes]) -> None:
    pids = _pids(stack)
    worker_pid, worker = pids["worker"], pids["worker_url"]
    assert memory_with_needles(worker_pid, needles[:3]), "the scan must find the weights while serving"
    token = (stack.home / "broker" / "admin-token").read_text().strip()
    r = httpx.post(f"{pids['broker_url']}/v1/admin/tenants/{DEMO_TENANT}/key/revoke",
                   headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 120
    # The wipe runs on the worker's event loop before anything else: a status call waits for it.
    while httpx.get(f"{worker}/internal/status", timeout=60).json()["status"] == "ready":
        assert time.monotonic() < deadline, "the worker kept serving a revoked key"
        time.sleep(0.5)
    time.sleep(5)  # vLLM's shutdown (freeing the zeroed memory) follows the wipe
    assert memory_with_needles(worker_pid, needles[:3]) == []
    answer = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30.0,
                        headers={"Authorization": f"Bearer {stack.api_key}"},
                        json={"model": DEMO_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert answer.status_code == 503
