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
def test_sampling_extras_are_taken_in_range_and_refused_outside_it(model: type) -> None:
    body = {"model": "m", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    body.pop("messages" if model is CompletionRequest else "prompt")
    ok = model.model_validate({**body, "repetition_penalty": 1.2, "min_p": 0.1, "logit_bias": {"5": -100},
                               "guided_choice": ["yes", "no"]})
    assert (ok.repetition_penalty, ok.min_p, ok.logit_bias) == (1.2, 0.1, {"5": -100})
    for bad in ({"repetition_penalty": 0}, {"min_p": 2}, {"logit_bias": {"x": 1}}, {"logit_bias": {"1": 200}},
                {"logit_bias": {str(i): 1 for i in range(301)}}, {"guided_choice": []}, {"top_a": 1}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            model.model_validate({**body, **bad})
