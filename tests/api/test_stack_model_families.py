"""Non-Llama families end to end: a tiny Gemma 2 checkpoint (sliding window, soft-capping, GeGLU)
made with `transformers`, encrypted as the demo tenant's model, released by the key broker to a
`sealed up`-style stack and answered through the gateway's OpenAI API with the official client:
greedy completions equal HF transformers' greedy tokens on the same prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from api.home import Home
from api.stack import DEMO_MODEL, free_port, launch, prepare_demo
from tests.enclave_worker.engine.models.tiny import build

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")

MAX_TOKENS = 12


@pytest.mark.parametrize("family", ["gemma2"])
def test_tiny_family_served_through_the_openai_api(family: str, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    src = tmp_path / "src"
    hf = build(family, src)
    home = Home(tmp_path / "home")
    demo = prepare_demo(home, model_path=src, log=lambda *_: None)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    prompts = ["The capital of France is", "def fibonacci(n):"]
    expected = []
    with torch.inference_mode():
        for text in prompts:
            ids = tok.encode(text, add_special_tokens=False).ids
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              min_new_tokens=MAX_TOKENS, eos_token_id=None, pad_token_id=0)
            expected.append(tok.decode(out[0, len(ids):].tolist()))
    running = launch(home, port=free_port())
    try:
        running.wait_answering(demo.api_key, DEMO_MODEL, timeout=300)
        client = openai.OpenAI(base_url=f"{running.gateway_url}/v1", api_key=demo.api_key)
        for text, want in zip(prompts, expected, strict=True):
            done = client.completions.create(model=DEMO_MODEL, prompt=text, max_tokens=MAX_TOKENS, temperature=0)
            assert done.choices[0].text == want, text
            assert done.usage is not None and done.usage.completion_tokens == MAX_TOKENS
        chat = client.chat.completions.create(model=DEMO_MODEL, max_tokens=MAX_TOKENS, temperature=0,
                                              messages=[{"role": "user", "content": "Hello"}])
        assert chat.choices[0].message.content is not None and chat.usage is not None
        assert chat.usage.completion_tokens >= 1
    finally:
        running.stop()
