"""`sealed up --engine vllm`: the same stack and the same OpenAI conformance checks, with the
encrypted default model served by vLLM inside the worker (docs/vllm-backend.md).

One stack for the module (vLLM is heavy); the conformance, in-enclave policy, sealed-mode and log
tests are our engine's own, imported and run against it. The last test revokes the tenant's key:
the worker wipes vLLM's weights and KV cache, and its memory holds no plaintext weight bytes
afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
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
    test_n_seed_and_stop,
    test_usage_endpoint_and_metrics,
)
from tests.api.test_sealed_e2e import (  # noqa: F401
    CASES,
    _call,
    _same,
    plain,
    sealed,
    test_receipt_counts_match_the_usage_the_client_sees,
)
from tests.api.test_stack_security import (  # noqa: F401
    test_logs_and_audit_hold_no_prompts_or_completions,
    test_no_key_material_in_logs,
)

pytestmark = pytest.mark.vllm

# Requests whose answer the engine must constrain (JSON mode and schemas, forced tool calls): the
# vLLM backend refuses them (vLLM's structured outputs need its own tokenizer, which this backend
# never gives it; docs/vllm-backend.md), so they are checked as refusals, not as answers.
CONSTRAINED = ("forced tool call", "json mode", "json schema sampled", "json schema streamed")


@pytest.mark.parametrize("case", [c for c in CASES if c not in CONSTRAINED])
def test_sealed_answers_exactly_as_plaintext(stack: RunningStack, case: str) -> None:
    kind, args = CASES[case]
    s = sealed(stack)
    _same(_call(s, kind, args), _call(plain(stack), kind, args))
    assert len(s.sealed.receipts) == 1 and s.sealed.receipts[0].completion_tokens > 0


@pytest.mark.parametrize("case", CONSTRAINED)
@pytest.mark.parametrize("mode", ["plaintext", "sealed"])
def test_a_constrained_request_is_a_400_naming_the_backend_never_an_unconstrained_answer(
        stack: RunningStack, case: str, mode: str) -> None:
    kind, args = CASES[case]
    client = sealed(stack) if mode == "sealed" else plain(stack)
    with pytest.raises(openai.BadRequestError) as refused:
        answer = _call(client, kind, args)
        pytest.fail(f"answered without its constraint: {answer!r}")
    assert "not available on the vLLM engine backend" in str(refused.value)


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
