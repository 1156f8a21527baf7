"""Issue #49 on a GPU, one prepared run (about 10 minutes on an H100 or H200 with 16 cores):

1. make        an 8B-shaped bf16 model on the device: Llama 3.1 8B's layers, widths, heads, GQA and rope
               scaling, seeded random weights (sealed_bench.gpu_models); the vocabulary is SmolLM2's
               49,152 tokens (the tokenizer we ship), not Llama's 128,256: 7.4 B parameters, 14.8 GB.
2. hf_greedy   greedy equality with HF transformers on the device, both in bf16, 4 prompts x 32 tokens
               (a peaked head, so no step is decided by a tie).
3. coldstart   encrypt the package (on the host), decrypt it into GPU memory (GB/s), build the engine
               from it (the KV pool from gpu_memory_utilization), and the first token.
4. serve       `vllm serve` on the plaintext safetensors, then `sealed up` with the GPU worker on the same
               package, each under `vllm bench serve` (random 128 in / 128 out, 64 prompts, concurrency
               16); with the worker's cold-start phases (enclave_worker/cold_start.py). Needs vLLM and the
               project's dependencies on the machine; without them the row says which is missing.

A section that fails is a row with its error; the later ones still run. Run with tests/gpu/big_model.sh.
`--dry-run` runs every section at the "tiny" shape on the CPU (no vLLM): what can be checked without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from enclave_worker.engine import Checkpoint, EngineConfig, LLMEngine, SamplingParams
from enclave_worker.engine.config import RequestOutput
from sealed_bench.gpu_models import ARCHS, VOCAB, arch_config, random_tensors, tokenizer_assets

LLAMA_3_1_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
                "tie_word_embeddings": False,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
SERVED = "smollm2-135m-instruct"  # the demo model's name at the gateway; vllm serve takes the same
GPU_MEMORY_UTILIZATION = 0.45  # one server at a time, but leave room for a straggler's memory


def model_config(shape: str) -> dict[str, Any]:
    if shape == "llama-3.1-8b":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
                "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2,
                **LLAMA_3_1_8B}
    return arch_config(shape)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def free(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def make(shape: str, device: str, assets: Path | None) -> tuple[Checkpoint, dict[str, Any]]:
    cfg = model_config(shape)
    tok, template = tokenizer_assets(assets)
    start = time.perf_counter()
    tensors = random_tensors(cfg, device, torch.bfloat16, seed=1, head_std=1.0)
    sync(device)
    seconds = time.perf_counter() - start
    nbytes = sum(t.nbytes for t in tensors.values())
    return Checkpoint(config=cfg, tensors=tensors, tokenizer_json=tok, chat_template=template), {
        "shape": shape, "parameters": sum(t.numel() for t in tensors.values()), "bytes": nbytes,
        "make_s": round(seconds, 2), "config": cfg}


def _prompts(n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    return torch.randint(3, VOCAB, (n, length), generator=g).tolist()


def _engine(checkpoint: Checkpoint, device: str, utilization: float | None) -> LLMEngine:
    tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}
    cfg = EngineConfig(device=device, dtype="bfloat16", max_num_seqs=4, max_model_len=256,
                       kv_cache_memory_bytes=1 << 30, gpu_memory_utilization=utilization,
                       enable_prefix_caching=False)
    return LLMEngine.from_checkpoint(dataclasses.replace(checkpoint, tensors=tensors), cfg)


def _greedy(engine: LLMEngine, batch: list[list[int]], n_tokens: int) -> list[list[int]]:
    outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(batch))}
    params = SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True)

    def sink(tokens: list[int]) -> Callable[[RequestOutput | BaseException], None]:
        def take(out: RequestOutput | BaseException) -> None:
            if isinstance(out, BaseException):
                raise out
            tokens.extend(out.delta_token_ids)
        return take

    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, params, sink(outs[f"r{i}"]))
    while engine.has_unfinished_requests():
        engine.step()
    return [outs[f"r{i}"] for i in range(len(batch))]


def hf_greedy(checkpoint: Checkpoint, device: str, n_prompts: int = 4, n_tokens: int = 32) -> dict[str, Any]:
    from sealed_bench.gpu_models import hf_model

    batch = _prompts(n_prompts, 16)
    hf = hf_model(checkpoint, device, torch.bfloat16)  # HF first: its fp32 init is the run's peak
    ref = hf.generate(torch.tensor(batch, device=device), max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                      do_sample=False, pad_token_id=0)[:, 16:].tolist()
    del hf
    free(device)
    engine = _engine(checkpoint, device, None)
    ours = _greedy(engine, batch, n_tokens)
    del engine
    free(device)
    firsts = [next((j for j, (a, b) in enumerate(zip(o, r, strict=True)) if a != b), None) for o, r in zip(ours, ref,
                                                                                                          strict=True)]
    return {"prompts": n_prompts, "tokens": n_tokens, "equal": sum(f is None for f in firsts),
            "first_difference_at": firsts, "pass": all(f is None for f in firsts)}


def coldstart(checkpoint: Checkpoint, host: dict[str, torch.Tensor], device: str, work: Path) -> dict[str, Any]:
    """``host``: the same weights in host memory (what a tenant encrypts); the device's copy is dropped
    before the package is decrypted into device memory."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from enclave_worker.package.device_reader import decrypt_package_to_device
    from enclave_worker.package.writer import write_package

    key = secrets.token_bytes(32)
    start = time.perf_counter()
    manifest = write_package(work / "pkg", metadata={"config": checkpoint.config,
                                                     "tokenizer_json": checkpoint.tokenizer_json,
                                                     "chat_template": checkpoint.chat_template},
                             tensors=list(host.items()), data_key=key, key_id="dek-gpu", tenant="t", model="m",
                             version="v1", signing_key=Ed25519PrivateKey.generate())
    encrypt_s = time.perf_counter() - start
    checkpoint.tensors.clear()  # the device holds only what the package decrypts into
    free(device)
    start = time.perf_counter()
    model = decrypt_package_to_device(work / "pkg", key, device)
    sync(device)
    decrypt_s = time.perf_counter() - start
    start = time.perf_counter()
    engine = LLMEngine.from_checkpoint(
        Checkpoint(config=model.metadata["config"], tensors=dict(model.tensors),
                   tokenizer_json=model.metadata["tokenizer_json"], chat_template=model.metadata["chat_template"]),
        EngineConfig(device=device, dtype="bfloat16", max_num_seqs=16, max_model_len=1024,
                     gpu_memory_utilization=GPU_MEMORY_UTILIZATION if torch.device(device).type == "cuda" else None))
    sync(device)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    _greedy(engine, _prompts(1, 128), 1)
    first_token_s = time.perf_counter() - start
    stats = engine.stats()
    del engine, model
    free(device)
    gb = manifest.plaintext_bytes / 1e9
    return {"plaintext_gb": round(gb, 3), "encrypt_s": round(encrypt_s, 2), "encrypt_gb_s": round(gb / encrypt_s, 2),
            "decrypt_to_device_s": round(decrypt_s, 2), "decrypt_gb_s": round(gb / decrypt_s, 2),
            "load_s": round(load_s, 2), "first_token_s": round(first_token_s, 3),
            "num_kv_blocks": stats["num_kv_blocks"], "max_model_len": stats["max_model_len"]}


def _bench_serve(url: str, tokenizer: Path, out: Path, api_key: str) -> dict[str, Any]:
    cmd = ["vllm", "bench", "serve", "--backend", "openai-chat", "--base-url", url, "--endpoint",
           "/v1/chat/completions", "--model", SERVED, "--tokenizer", str(tokenizer), "--dataset-name", "random",
           "--random-input-len", "128", "--random-output-len", "128", "--num-prompts", "64",
           "--max-concurrency", "16", "--ignore-eos", "--seed", "7", "--save-result",
           "--result-dir", str(out.parent), "--result-filename", out.name]
    done = subprocess.run(cmd, env={**os.environ, "OPENAI_API_KEY": api_key}, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-1500:] + done.stderr[-1500:])
    doc = json.loads(out.read_text())
    return {k: doc.get(k) for k in ("completed", "output_throughput", "median_ttft_ms", "median_tpot_ms", "duration")}


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(url)


def serve(checkpoint: Checkpoint, work: Path) -> dict[str, Any]:
    missing = [m for m in ("vllm", "fastapi", "grpc", "httpx", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        return {"skipped": f"not installed here: {', '.join(missing)}"}
    from safetensors.torch import save_file

    from api.stack import free_port

    plain = work / "plain"  # the peer's input only (plaintext on this test machine's disk)
    plain.mkdir()
    save_file({k: v.contiguous() for k, v in checkpoint.tensors.items()}, str(plain / "model.safetensors"))
    (plain / "config.json").write_text(json.dumps({**checkpoint.config, "torch_dtype": "bfloat16"}))
    (plain / "tokenizer.json").write_text(checkpoint.tokenizer_json)
    (plain / "tokenizer_config.json").write_text(json.dumps({"chat_template": checkpoint.chat_template or ""}))
    row: dict[str, Any] = {}
    port = free_port()
    vllm = subprocess.Popen(["vllm", "serve", str(plain), "--served-model-name", SERVED, "--port", str(port),
                             "--dtype", "bfloat16", "--max-model-len", "1024", "--max-num-seqs", "16",
                             "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)],
                            stdout=open(work / "vllm.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        started = time.perf_counter()
        _wait(f"http://127.0.0.1:{port}/health", vllm, 240)
        row["vllm_cold_start_s"] = round(time.perf_counter() - started, 1)
        row["vllm_serve"] = _bench_serve(f"http://127.0.0.1:{port}", plain, work / "vllm.json", "none")
    finally:
        vllm.terminate()
        vllm.wait(60)
    row["sealed"] = _sealed_stack(checkpoint, work, plain)
    return row


def _sealed_stack(checkpoint: Checkpoint, work: Path, tokenizer: Path) -> dict[str, Any]:
    import httpx

    from api.home import Home
    from api.stack import free_port, launch, prepare_demo, worker_settings
    from tests.enclave_worker.demo_package import package_for_demo
    from tests.gpu.test_gpu_worker import _write_policies

    home = Home(work / "home")
    package_for_demo(home, checkpoint)
    checkpoint.tensors.clear()
    demo = prepare_demo(home, log=lambda *_: None)
    gpu = dataclasses.replace(worker_settings(home, "", 0), device="cuda",
                              gpu_memory_utilization=GPU_MEMORY_UTILIZATION)
    _write_policies(home, demo.api_key, gpu)
    started = time.perf_counter()
    stack = launch(home, port=free_port(), worker_extra_args=(
        "--device", "cuda", "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION), "--max-num-seqs", "16"))
    try:
        status = stack.wait_ready(timeout=300)
        ready_s = time.perf_counter() - started
        if status != "ready":
            raise RuntimeError((home.logs / "worker.log").read_text()[-3000:])
        bench = _bench_serve(stack.gateway_url, tokenizer, work / "sealed.json", demo.api_key)
        worker = httpx.get(f"{stack.worker_url}/internal/status", timeout=10).json()
    finally:
        stack.stop()
    phases = {k: v for k, v in worker["stats"].items() if k.startswith("sealed:cold_start_")}
    return {"stack_ready_s": round(ready_s, 1), "cold_start": phases, "vllm_bench_serve": bench,
            "load_s": worker["load_s"], "gpu_memory": worker["gpu_memory"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
    ap.add_argument("--assets", type=Path, default=Path(".gpu-assets"))
    ap.add_argument("--dry-run", action="store_true", help="every section at the tiny shape on the CPU, no vLLM")
    args = ap.parse_args(argv)
    shape, device = ("tiny", "cpu") if args.dry_run else ("llama-3.1-8b", "cuda")
    assert shape in ARCHS or shape == "llama-3.1-8b"
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                              "torch": torch.__version__, "dry_run": args.dry_run}

    def attempt(section: str, run: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            result = run()
            report[section] = result if not isinstance(result, tuple) else result[1]
            return result
        except Exception as exc:  # a failing section is a row with its error; the later ones still run
            report[section] = {"error": f"{type(exc).__name__}: {str(exc)[:1500]}",
                               "trace": traceback.format_exc()[-3000:]}
            return None
        finally:
            report.setdefault("section_s", {})[section] = round(time.perf_counter() - start, 1)
            (args.out / "big_model.json").write_text(json.dumps(report, indent=1, default=str))
            print(json.dumps({section: report[section]}, default=str)[:2000], flush=True)

    made = attempt("make", lambda: make(shape, device, args.assets if args.assets.is_dir() else None))
    if made is None:
        return 1
    checkpoint = made[0]
    attempt("hf_greedy", lambda: hf_greedy(checkpoint, device))
    host = {k: v.to("cpu") for k, v in checkpoint.tensors.items()}  # serve's input, once coldstart freed the device
    attempt("coldstart", lambda: coldstart(checkpoint, host, device, work))
    if not args.dry_run:
        attempt("serve", lambda: serve(dataclasses.replace(checkpoint, tensors=host), work))
    failed = [s for s in ("make", "hf_greedy", "coldstart", "serve") if isinstance(report.get(s), dict)
              and ("error" in report[s] or report[s].get("pass") is False)]
    verdict = "FAILED " + ", ".join(failed) if failed else "all sections ran"
    print(f"big_model: {verdict}; {args.out / 'big_model.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
