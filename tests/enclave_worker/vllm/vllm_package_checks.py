"""Runs in vLLM's virtualenv (started by test_vllm_formats.py): greedy tokens of encrypted packages served
by our vLLM engine, one package after the other in one process, JSON out.

`OUT PROMPTS_JSON PKG KEYHEX [PKG KEYHEX ...]`: for each package, the worker's path (decrypt, the sealed
loader, VllmEngine), greedy tokens of every prompt (EOS ignored), whether the decrypted buffer is zero once
vLLM holds the weights, and vLLM's layer types (no quantized layer: the loader hands over dense weights).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

MAX_TOKENS = 16
OPTIONS = dict(max_model_len=256, max_num_seqs=4, kv_cache_memory_bytes=32 << 20)


async def _greedy(engine, prompts: list[list[int]]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    from enclave_worker.engine.config import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)

    async def one(i: int, ids: list[int]) -> list[int]:
        tokens: list[int] = []
        async for out in engine.generate(f"p{i}", ids, params, cache_salt=b"t"):
            tokens += out.delta_token_ids
        return tokens

    try:
        return list(await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)]))
    finally:
        await engine.shutdown()  # vLLM dropped before the next package's engine is built


def serve(pkg: Path, key_hex: str, prompts: list[list[int]]) -> dict:
    from enclave_worker.engine.tokenizer import Tokenizer
    from enclave_worker.package import decrypt_package
    from enclave_worker.vllm_engine.engine import VllmEngine
    from enclave_worker.vllm_engine.runtime import VllmOptions, VllmRuntime

    model = decrypt_package(pkg, bytes.fromhex(key_hex))
    meta = model.metadata
    tokenizer = Tokenizer(meta["tokenizer_json"], meta.get("chat_template"), meta["config"])
    engine = VllmEngine.on_compute_thread(lambda: VllmRuntime(meta["config"], lambda: model, VllmOptions(**OPTIONS)),
                                          tokenizer)
    vllm_model = engine.runtime._model_runner().get_model()
    result = {"buffer_nonzero_after_load": int(model.buffer.count_nonzero()),
              "quant_methods": sorted({type(m.quant_method).__name__ for m in vllm_model.modules()
                                       if getattr(m, "quant_method", None) is not None}),
              "architecture": type(vllm_model).__name__,
              "greedy": asyncio.run(_greedy(engine, prompts))}
    return result


def main(argv: list[str]) -> int:
    out, prompts_json, *pairs = argv
    prompts = json.loads(prompts_json)
    results = [serve(Path(pairs[i]), pairs[i + 1], prompts) for i in range(0, len(pairs), 2)]
    Path(out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
