"""Request schema edges that clients outside the openai SDK rely on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol.openai.schemas import ChatCompletionRequest, CompletionRequest


def test_vllm_bench_serves_request_body_is_accepted() -> None:
    """What `vllm bench serve --backend openai` sends (vllm 0.32, endpoint_request_func.py)."""
    body = {"model": "m", "prompt": "hi", "repetition_penalty": 1.0, "max_tokens": 4, "logprobs": None,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert CompletionRequest.model_validate(body).repetition_penalty == 1.0


@pytest.mark.parametrize("model", [CompletionRequest, ChatCompletionRequest])
def test_a_repetition_penalty_the_engine_cannot_apply_is_refused(model: type) -> None:
    body = {"model": "m", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1.2}
    body.pop("messages" if model is CompletionRequest else "prompt")
    with pytest.raises(ValidationError, match=r"only 1\.0"):
        model.model_validate(body)
