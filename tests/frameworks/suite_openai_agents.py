"""The OpenAI Agents SDK on its default model (the Responses API), plaintext and through
AsyncSealedOpenAI: a tool-using agent, a handoff, structured output, streaming, and a two-turn run
through previous_response_id."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.items import HandoffOutputItem, ToolCallOutputItem
from agents.models.openai_responses import OpenAIResponsesModel
from conftest import MODES, openai_clients, stack
from pydantic import BaseModel, Field

set_tracing_disabled(True)  # traces would go to OpenAI's servers; nothing leaves the test machine
CALLED: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    CALLED.append(city)
    return f"It is sunny and 21 degrees in {city}."


class Weather(BaseModel):
    city: str = Field(max_length=24)
    sunny: bool


@pytest.fixture(params=MODES)
def model(request: pytest.FixtureRequest) -> OpenAIResponsesModel:
    _, client = openai_clients(request.param)
    return OpenAIResponsesModel(model=stack()[2], openai_client=client)


def settings(**kw: Any) -> ModelSettings:
    return ModelSettings(temperature=0, max_tokens=64, **kw)


async def test_a_tool_using_agent(model: OpenAIResponsesModel) -> None:
    CALLED.clear()
    # The call is forced (required) and its output is the run's answer (stop_on_first_tool): whether the
    # 135M model would call again after a result, rather than answer, is its quality, not the protocol.
    agent = Agent(name="weather", instructions="Answer weather questions with the tool.", model=model,
                  tools=[get_weather], model_settings=settings(tool_choice="required"),
                  tool_use_behavior="stop_on_first_tool")
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=2)
    assert len(CALLED) == 1 and any(isinstance(i, ToolCallOutputItem) for i in result.new_items)
    assert result.final_output == f"It is sunny and 21 degrees in {CALLED[0]}."


async def test_a_handoff(model: OpenAIResponsesModel) -> None:
    french = Agent(name="french", instructions="Answer in French.", model=model, model_settings=settings())
    triage = Agent(name="triage", instructions="Hand off to the french agent.", model=model, handoffs=[french],
                   model_settings=settings(tool_choice="required"))
    result = await Runner.run(triage, "Bonjour !", max_turns=4)
    assert result.last_agent is french and any(isinstance(i, HandoffOutputItem) for i in result.new_items)
    assert isinstance(result.final_output, str)


async def test_structured_output(model: OpenAIResponsesModel) -> None:
    agent = Agent(name="typed", instructions="Describe the weather in Paris.", model=model, output_type=Weather,
                  model_settings=settings())
    result = await Runner.run(agent, "Paris: sunny.", max_turns=2)
    assert isinstance(result.final_output, Weather)  # text.format json_schema, strict: enforced while decoding


async def test_streaming(model: OpenAIResponsesModel) -> None:
    agent = Agent(name="streamer", instructions="Be brief.", model=model, model_settings=settings())
    result = Runner.run_streamed(agent, "Say hello.")
    deltas = [e.data.delta async for e in result.stream_events()
              if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == result.final_output


async def test_a_two_turn_run_through_previous_response_id(model: OpenAIResponsesModel) -> None:
    # Sealed too: the worker seals the stored state and checks the chain it continues (docs/sealed-mode.md).
    agent = Agent(name="memory", instructions="Be brief.", model=model, model_settings=settings())
    first = await Runner.run(agent, "My name is Ada.")
    assert first.last_response_id
    second = await Runner.run(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert second.last_response_id and second.last_response_id != first.last_response_id
    assert isinstance(second.final_output, str)
