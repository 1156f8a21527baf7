"""The tenant's signed policy is enforced inside the worker, through the real stack."""

from __future__ import annotations

from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import openai
import pytest

from api.stack import DEMO_MODEL


def client(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)


def test_prompt_with_blocked_pii_is_refused_inside_the_worker(stack: RunningStack) -> None:
    with pytest.raises(openai.PermissionDeniedError) as err:
        client(stack).chat.completions.create(
            model=DEMO_MODEL, max_tokens=8,
            messages=[{"role": "user", "content": "My social security number is 123-45-6789, remember it."}])
    assert err.value.body["code"] == "content_policy_violation"
    assert "123-45" not in str(err.value.body)


def test_tool_outside_the_agents_allowlist_is_refused_before_the_answer_leaves(stack: RunningStack) -> None:
    tool = {"type": "function", "function": {"name": "delete_files", "description": "Delete files",
                                             "parameters": {"type": "object", "properties": {
                                                 "path": {"type": "string"}}}}}
    with pytest.raises(openai.PermissionDeniedError) as err:
        client(stack).chat.completions.create(
            model=DEMO_MODEL, max_tokens=32, temperature=0, tools=[tool],
            tool_choice={"type": "function", "function": {"name": "delete_files"}},
            messages=[{"role": "user", "content": "Clean up my home directory."}])
    assert "agent policy" in err.value.body["message"]


DELETE_FILES = {"type": "function", "function": {"name": "delete_files", "description": "Delete files",
                                                 "parameters": {"type": "object", "properties": {
                                                     "path": {"type": "string"}}}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("max_tokens", [1, 3, 6])
def test_a_tool_call_cut_off_by_max_tokens_is_checked_like_a_whole_one(stack: RunningStack, stream: bool,
                                                                       max_tokens: int) -> None:
    """Regression (#12): the gateway repairs a call the model did not finish (`<tool_call>{"name":
    "delete_files", "arguments": {"path": "/home`) into a tool call; the in-enclave guard must see
    that same call and refuse it, streamed or not, instead of passing text it could not parse."""
    with pytest.raises(openai.PermissionDeniedError) as err:
        answer = client(stack).chat.completions.create(
            model=DEMO_MODEL, max_tokens=max_tokens, temperature=0, tools=[DELETE_FILES], stream=stream,
            tool_choice={"type": "function", "function": {"name": "delete_files"}},
            messages=[{"role": "user", "content": "Delete everything under /home."}])
        leaked = list(answer) if stream else [answer]
        pytest.fail(f"a forbidden tool call reached the client: {leaked!r}")
    assert "agent policy" in err.value.body["message"]
