"""The real model's first layers through the fused decode path (Triton kernels under the interpreter)
and through the CUDA-graph bookkeeping (replayed by calling the step on the CPU) give the torch
path's tokens. Two of SmolLM2's 30 layers keep the interpreter's cost inside CI's budget."""

from __future__ import annotations

import dataclasses

import pytest

from enclave_worker.engine import EngineConfig, LLMEngine, SamplingParams

PARAMS = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
LAYERS = 2


@pytest.fixture(scope="module")
def make_engine(checkpoint):  # type: ignore[no-untyped-def]
    """Engines over the first LAYERS layers of the real checkpoint (real weights, real tokenizer)."""
    keep = {k: v for k, v in checkpoint.tensors.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < LAYERS}

    def make(**overrides) -> LLMEngine:  # type: ignore[no-untyped-def]
        cfg = EngineConfig(**{"max_num_seqs": 16, "kv_cache_memory_bytes": 8 << 20, "num_threads": 1, **overrides})
        small = dataclasses.replace(checkpoint, config={**checkpoint.config, "num_hidden_layers": LAYERS},
                                    tensors={k: v.clone() for k, v in keep.items()})
        return LLMEngine(small, cfg)

    return make


@pytest.fixture(scope="module")
def reference(make_engine, h) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    eng = make_engine(decode_kernels="torch")
    prompts = [eng.tokenizer.encode(p) for p in h.prompts[:3]]
    outs = h.run_sync(eng, [(f"r{i}", p, PARAMS) for i, p in enumerate(prompts)])
    return {rid: h.tokens_of(o) for rid, o in outs.items()}


def _prompts(engine, h) -> list[tuple[str, list[int], SamplingParams]]:  # type: ignore[no-untyped-def]
    return [(f"r{i}", engine.tokenizer.encode(p), PARAMS) for i, p in enumerate(h.prompts[:3])]


def test_fused_decode_kernels_match_the_torch_path(make_engine, h, reference) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(decode_kernels="triton")
    assert eng.runner.fused_decode
    outs = h.run_sync(eng, _prompts(eng, h))
    assert {rid: h.tokens_of(o) for rid, o in outs.items()} == reference
    # every fused decode step brought its inputs over in one packed copy
    assert eng.runner.transfers.host_to_device == 4  # 5 tokens: 1 from prefill, 4 fused decode steps


def test_decode_graph_bookkeeping_pads_and_matches(make_engine, h, reference) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(decode_kernels="triton", max_num_seqs=4)
    last_block = eng.blocks.num_blocks - 1  # never allocated by these three short requests
    eng.runner.enable_decode_graphs(max_num_seqs=4, pad_slot=last_block * eng.config.block_size)
    assert eng.runner.graphs is not None and eng.runner.graphs.sizes == (1, 2, 4)
    outs = h.run_sync(eng, _prompts(eng, h))  # three sequences replay the size-4 graph, one row padded
    assert {rid: h.tokens_of(o) for rid, o in outs.items()} == reference
    counter = eng.runner.transfers
    assert counter.host_to_device == counter.device_to_host == 4  # two crossings per decode step
