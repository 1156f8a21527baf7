"""The generic decoder under the GPU engine's step shapes, run on the CPU: fused decode metadata (int32
slots, block tables padded to one width, context lengths) and the CUDA-graph bookkeeping (padded
batches, replayed by calling the step) give the torch path's tokens, for a windowed soft-capped
family, an MoE family and a q/k-norm family."""

from __future__ import annotations

import pytest

from enclave_worker.engine import EngineConfig, LLMEngine, SamplingParams, load_hf_dir
from tests.enclave_worker.engine.models.tiny import build

pytest.importorskip("transformers")
pytest.importorskip("triton")  # decode_kernels="triton" needs the package (its kernels are not called here)

PARAMS = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
PROMPTS = [[5, 77, 200, 13], [9, 9, 140, 33, 61, 250, 4, 18, 99, 7, 120, 3, 45], list(range(30, 50))]


def _tokens(path, **overrides) -> tuple[LLMEngine, dict[str, list[int]]]:  # type: ignore[no-untyped-def]
    engine = LLMEngine.from_checkpoint(load_hf_dir(path), EngineConfig(
        **{"max_num_seqs": 4, "kv_cache_memory_bytes": 8 << 20, "num_threads": 1, "block_size": 8, **overrides}))
    return engine, engine_tokens(engine)


def engine_tokens(engine: LLMEngine) -> dict[str, list[int]]:
    outs: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, PARAMS, lambda o: outs[o.request_id].extend(o.delta_token_ids))
    while engine.has_unfinished_requests():
        engine.step()
    return outs


@pytest.mark.parametrize("family", ["gemma2", "mixtral", "qwen3"])
def test_fused_decode_steps_and_graph_bookkeeping_match_the_torch_path(family: str, tmp_path) -> None:
    build(family, tmp_path)
    _, reference = _tokens(tmp_path, decode_kernels="torch")
    fused, tokens = _tokens(tmp_path, decode_kernels="triton")
    assert fused.runner.fused_decode and tokens == reference
    graphs = LLMEngine.from_checkpoint(load_hf_dir(tmp_path), EngineConfig(
        max_num_seqs=4, kv_cache_memory_bytes=8 << 20, num_threads=1, block_size=8, decode_kernels="triton"))
    last_block = graphs.blocks.num_blocks - 1  # never allocated by these three short requests
    graphs.runner.enable_decode_graphs(max_num_seqs=4, pad_slot=last_block * graphs.config.block_size)
    assert engine_tokens(graphs) == reference  # three rows replay the size-4 step, one padded
