"""pydantic-ai's OpenAI chat model with a tool and with structured output (its tool output mode, and
its native mode: response_format json_schema), plaintext and through AsyncSealedOpenAI."""

from __future__ import annotations

import pytest
from conftest import MODES, openai_clients, stack
from pydantic import BaseModel, Field
from pydantic_ai import Agent, NativeOutput, RunContext
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition

SETTINGS = ModelSettings(temperature=0, max_tokens=64)


class Weather(BaseModel):
    city: str = Field(max_length=24)
    sunny: bool


@pytest.fixture(params=MODES)
def model(request: pytest.FixtureRequest) -> OpenAIChatModel:
    _, client = openai_clients(request.param)
    return OpenAIChatModel(stack()[2], provider=OpenAIProvider(openai_client=client))


async def test_a_tool_then_structured_output(model: OpenAIChatModel) -> None:
    """tool_choice names the tool and the output tool (pydantic-ai refuses a static choice that names no
    output tool), so every step is a call; the tool is offered until it is called once, so the run is the
    tool's call and then the final result's, or the final result's alone."""
    called: list[str] = []
    agent = Agent(model, output_type=Weather, model_settings=SETTINGS,
                  instructions="Call get_weather, then give the final result.")

    async def until_called(ctx: RunContext[None], tool: ToolDefinition) -> ToolDefinition | None:
        return None if called else tool  # offered until called once: a run of at most two steps

    @agent.tool_plain(prepare=until_called)
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return f"sunny in {city}"

    result = await agent.run("Weather in Paris?", model_settings={"tool_choice": ["get_weather", "final_result"]})
    assert isinstance(result.output, Weather)  # the output tool's arguments: enforced while decoding
    returns = {p.tool_name for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)}
    assert "final_result" in returns
    if not called:  # the protocol offered both; which one first is the model's choice
        pytest.xfail("quality: the 135M model went straight to the final result without calling get_weather")
    assert "get_weather" in returns and called == [called[0]]


async def test_native_structured_output(model: OpenAIChatModel) -> None:
    agent = Agent(model, output_type=NativeOutput(Weather), model_settings=SETTINGS)
    result = await agent.run("Paris is sunny. Describe its weather.")
    assert isinstance(result.output, Weather)  # response_format json_schema: enforced while decoding


async def test_plain_text(model: OpenAIChatModel) -> None:
    result = await Agent(model, model_settings=SETTINGS).run("Say hello.")
    assert isinstance(result.output, str) and result.output
