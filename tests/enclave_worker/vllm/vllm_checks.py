"""Runs in vLLM's virtualenv (started by test_vllm_engine.py): one vLLM engine, many checks, JSON out.

`sealed PKG KEYHEX OUT`: our VllmEngine loads the encrypted package through the sealed loader;
greedy tokens of the 8 prompts, prefix-cache hits per tenant salt, stop strings, logprobs,
structured output (structured_checks.py), cancellation, and the revocation wipe.
`plain DIR OUT`: the reference: vLLM's own default loader on a plaintext safetensors directory
(written by the test into its temporary directory, for this comparison only).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain photosynthesis in one sentence.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Name a famous painting by Leonardo da Vinci.",
]
MAX_TOKENS = 24
OPTIONS = dict(max_model_len=1024, max_num_seqs=8, kv_cache_memory_bytes=128 << 20)


def prompt_ids(tokenizer) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]


def _nonzero(tensor) -> int:  # type: ignore[no-untyped-def]
    from enclave_worker.vllm_engine.packed import raw_bytes

    if tensor.is_mkldnn:
        return int(bool(raw_bytes(tensor).strip(b"\0")))
    return int(tensor.count_nonzero() > 0)


async def _run(engine, rid: str, ids: list[int], params, salt: bytes = b"") -> dict:  # type: ignore[no-untyped-def]
    text, tokens, logprobs, last, deltas = "", [], [], None, 0
    async for out in engine.generate(rid, ids, params, cache_salt=salt):
        deltas += bool(out.delta_text)
        text += out.delta_text
        tokens += out.delta_token_ids
        logprobs += [(lp.token_id, lp.logprob, [list(t) for t in lp.top]) for lp in out.logprobs or ()]
        last = out
    return {"text": text, "tokens": tokens, "finish": last.finish_reason, "logprobs": logprobs,
            "completion_tokens": last.completion_tokens, "deltas": deltas}


async def sealed_checks(engine, tokenizer) -> dict:  # type: ignore[no-untyped-def]
    from enclave_worker.engine.config import SamplingParams

    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    ids = prompt_ids(tokenizer)
    # All eight at once: continuous batching inside vLLM, each request on its own tenant salt.
    runs = await asyncio.gather(*[_run(engine, f"g{i}", p, greedy, b"t%d" % i) for i, p in enumerate(ids)])
    result: dict = {"greedy": [r["tokens"] for r in runs], "texts": [r["text"] for r in runs]}
    # Prefix cache: a long shared prompt, tenant A twice, then tenant B.
    long_ids = tokenizer.encode(" ".join(["The quick brown fox jumps over the lazy dog."] * 60))
    one = SamplingParams(max_tokens=1, temperature=0)
    hits = []
    for rid, salt in (("a1", b"tenant-a"), ("a2", b"tenant-a"), ("b1", b"tenant-b")):
        before = engine.prefix_cached_tokens
        await _run(engine, rid, long_ids, one, salt)
        hits.append(engine.prefix_cached_tokens - before)
    result["prefix_hits"] = {"a_first": hits[0], "a_repeat": hits[1], "b_first": hits[2],
                             "prompt_tokens": len(long_ids), "block_size": engine.runtime.block_size}
    # Stop string, stop token id, logprobs.
    paris = await _run(engine, "s1", ids[0], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop=("Paris",)))
    result["stop_string"] = paris
    first_token = runs[0]["tokens"][2]
    result["stop_id"] = await _run(engine, "s2", ids[0], SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                       stop_token_ids=(first_token,)))
    result["stop_id"]["stop_token"] = first_token
    result["logprobs"] = await _run(engine, "l1", ids[1], SamplingParams(max_tokens=4, temperature=0, logprobs=3))
    result["seeded"] = [(await _run(engine, f"r{i}", ids[2], SamplingParams(max_tokens=8, temperature=0.8,
                                                                           seed=7)))["tokens"] for i in range(2)]
    # Structured output through vLLM's own support (structured_checks.py).
    from tests.enclave_worker.vllm.structured_checks import structured_checks

    result["structured"] = await structured_checks(engine, tokenizer, _run)
    # Cancellation: close the stream after the first delta; vLLM must drop the request.
    stream = engine.generate("c1", ids[3], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
    await anext(stream)
    await stream.aclose()
    for _ in range(200):
        if engine.runtime.llm.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    result["unfinished_after_cancel"] = engine.runtime.llm.get_num_unfinished_requests()
    # The stepping thread runs as vLLM's CPU worker process would: its CPUs, that many threads.
    import os

    result["stepping"] = {"cpus": engine.runtime.stepping_cpus, "all_cpus": sorted(os.sched_getaffinity(0)),
                          "thread_cpus": sorted(os.sched_getaffinity(engine._thread.native_id)),
                          "thread": engine._thread.name, "main": threading.main_thread().name,
                          "env": engine.runtime.cpu_env,
                          "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}
    # Revocation: zero in place (we keep references to look), then vLLM is dropped. Packed weights
    # are read byte by byte over oneDNN's whole allocation, padding included.
    from enclave_worker.vllm_engine.packed import packed_tensors

    held = engine.held_tensors()
    kv = engine.runtime.kv_cache_tensors()
    packs = packed_tensors(engine.runtime._model_runner().get_model())
    result["wipe"] = {"tensors": len(held), "kv_tensors": len(kv), "packed": len(packs),
                      "packed_held": sum(any(p is t for t in held) for p in packs),
                      "nonzero_before": sum(_nonzero(t) for t in held),
                      "packed_nonzero_before": sum(_nonzero(t) for t in packs),
                      "kv_nonzero_before": sum(_nonzero(t) for t in kv)}
    engine.wipe()
    result["wipe"]["nonzero_after"] = sum(_nonzero(t) for t in held)
    result["wipe"]["packed_nonzero_after"] = sum(_nonzero(t) for t in packs)
    await engine.shutdown()  # what the worker's revocation runs next: vLLM is dropped, memory freed
    result["wipe"]["released"] = not hasattr(engine.runtime, "llm")
    return result


def sealed(pkg: Path, key_hex: str) -> dict:
    from enclave_worker.engine.tokenizer import Tokenizer
    from enclave_worker.package import decrypt_package
    from enclave_worker.vllm_engine.engine import VllmEngine
    from enclave_worker.vllm_engine.runtime import VllmOptions, VllmRuntime

    model = decrypt_package(pkg, bytes.fromhex(key_hex))
    meta = model.metadata
    tokenizer = Tokenizer(meta["tokenizer_json"], meta.get("chat_template"), meta["config"])
    built_on: list[str] = []

    def make_runtime() -> VllmRuntime:  # as build_vllm_engine builds it, noting the thread
        built_on.append(threading.current_thread().name)
        return VllmRuntime(meta["config"], lambda: model, VllmOptions(**OPTIONS))

    engine = VllmEngine.on_compute_thread(make_runtime, tokenizer)
    result = {"buffer_nonzero_after_load": int(model.buffer.count_nonzero()), "built_on": built_on}
    result.update(asyncio.run(sealed_checks(engine, tokenizer)))
    return result


def plain(model_dir: Path) -> dict:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    from enclave_worker.engine.tokenizer import Tokenizer

    meta = json.loads((model_dir / "sealed-test-meta.json").read_text())
    tokenizer = Tokenizer(meta["tokenizer_json"], meta.get("chat_template"), meta["config"])
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, load_format="safetensors", dtype="float32",
              enforce_eager=True, seed=0, max_model_len=OPTIONS["max_model_len"],
              max_num_seqs=OPTIONS["max_num_seqs"], kv_cache_memory_bytes=OPTIONS["kv_cache_memory_bytes"])
    eos = list(tokenizer.eos_token_ids)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop_token_ids=eos, ignore_eos=True,
                            detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids(tokenizer)], params)
    return {"greedy": [list(o.outputs[0].token_ids) for o in outs]}


def main(argv: list[str]) -> int:
    mode, *args = argv
    result = sealed(Path(args[0]), args[1]) if mode == "sealed" else plain(Path(args[0]))
    Path(args[-1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
