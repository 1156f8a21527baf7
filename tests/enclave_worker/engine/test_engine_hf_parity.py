"""Greedy tokens and per-step logits match HF transformers (float32) on the default SmolLM2 GGUF."""

from __future__ import annotations

import os

import pytest
import torch

from enclave_worker.engine import SamplingParams

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


def _engine_greedy_with_logits(engine, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    captured: list[torch.Tensor] = []
    forward = engine.runner.forward

    def spy(*args, **kwargs):
        logits = forward(*args, **kwargs)
        captured.append(logits[0].clone())
        return logits

    engine.runner.forward = spy
    try:
        out: list = []
        engine.add_request(
            "parity",
            prompt,
            SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True),
            out.append,
        )
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        del engine.runner.forward
    return [t for o in out for t in o.delta_token_ids], captured


def test_greedy_tokens_and_logits_match_hf(engine, hf_model, h):
    tok = engine.tokenizer
    for text in h.prompts:
        prompt = tok.encode(text)
        ours, logits = _engine_greedy_with_logits(engine, prompt)
        assert len(ours) == NEW_TOKENS
        with torch.inference_mode():
            ref = hf_model(torch.tensor([prompt + ours])).logits[0].float()
        # teacher-forced on our tokens: HF's greedy choice at each step must be our token
        ref_steps = ref[len(prompt) - 1 : len(prompt) - 1 + NEW_TOKENS]
        assert ref_steps.argmax(-1).tolist() == ours, text
        for step, (mine, theirs) in enumerate(zip(logits, ref_steps, strict=True)):
            rel = ((mine - theirs).norm() / theirs.norm()).item()
            assert rel < 1e-3, (text, step, rel)


def test_tokenizer_matches_hf(engine, gguf_path, h):
    transformers = pytest.importorskip("transformers")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    texts = [
        *h.prompts,
        "Numbers 1234567 and  spaces\n\n tabs\t",
        "émoji 🤖 漢字 <|im_start|>user\nhi<|im_end|>",
    ]
    for text in texts:
        assert engine.tokenizer.encode(text) == hf_tok.encode(text, add_special_tokens=False), text
