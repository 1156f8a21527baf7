"""LangChain's standard integration tests for chat models (langchain-tests' ChatModelIntegrationTests)
with langchain_openai.ChatOpenAI, plaintext and through SealedOpenAI.

Tests the 135M demo model cannot pass for quality (the protocol answered correctly, the model's
answer is wrong) are xfailed below, each with why; a protocol failure is never listed here."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import openai_clients, stack
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

# Quality, not protocol: each names what the 135M model gets wrong.
_EXTRA_KEYS = ("quality: the forced call's arguments follow the tool's schema, which does not forbid other "
               "properties (no additionalProperties: false), and the 135M model adds one, copying the schema's "
               "own keywords into it; the test expects exactly the declared arguments")
_RAMBLES = ("quality: the answer follows the schema while decoding, but the 135M model never closes its "
            "string values, so max_tokens cuts it (finish_reason length; the SDK's parse raises "
            "LengthFinishReasonError, as it would against OpenAI for a cut answer)")
QUALITY: dict[str, str] = {
    "test_tool_calling": _EXTRA_KEYS,
    "test_tool_calling_async": _EXTRA_KEYS,
    "test_tool_calling_with_no_arguments": _EXTRA_KEYS,
    "test_structured_output": _RAMBLES,
    "test_structured_output_async": _RAMBLES,
    "test_structured_output_optional_param": _RAMBLES,
    "test_structured_output_pydantic_2_v1": _RAMBLES + "; here through a forced call, whose cut arguments "
                                            "lack the required punchline",
    "test_json_mode": _RAMBLES,
    "test_agent_loop": "quality: under tool_choice auto the 135M model answers in prose instead of calling "
                       "get_weather (the test cannot force the call)",
}


class _Standard(ChatModelIntegrationTests):
    mode = "plain"

    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict[str, Any]:
        url, key, model = stack()
        # Clients of our own, new for each model: ChatOpenAI's default shares one cached connection
        # pool across tests, each on its own event loop ("Event loop is closed" on the second).
        sync, async_ = openai_clients(self.mode)
        return {"model": model, "base_url": url, "api_key": key, "temperature": 0, "max_tokens": 160,
                "max_retries": 0, "stream_usage": True, "root_client": sync, "client": sync.chat.completions,
                "root_async_client": async_, "async_client": async_.chat.completions}

    @property
    def tool_choice_value(self) -> str:
        """Forcing a call ("any": OpenAI's "required") is supported; where a test offers it, the call is
        then the protocol's, not the 135M model's choice."""
        return "any"

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @pytest.fixture(autouse=True)
    def _quality(self, request: pytest.FixtureRequest) -> None:
        name = request.node.originalname
        if name in QUALITY:
            request.applymarker(pytest.mark.xfail(reason=QUALITY[name], strict=False))


class TestPlain(_Standard):
    mode = "plain"


class TestSealed(_Standard):
    mode = "sealed"
