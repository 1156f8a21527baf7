"""Structured output on the vLLM backend, run in vLLM's virtualenv by vllm_checks.py (one engine):
the acceptance suite of JSON schemas (tests/enclave_worker/schema_suite.py) at temperature 1, all at
once through vLLM's continuous batching, and the same asked unconstrained; a regex, a named tool
call's arguments (a Lark grammar), constraints vLLM cannot build, and the grammar text vLLM compiles
against our engine's. Answers are returned as text: test_vllm_engine.py validates them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from tests.enclave_worker.schema_suite import FREE, MAX_TOKENS, SCHEMAS, ask

WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
BAD = {"json_schema": "{not json", "regex": "(unclosed", "lark": "start: undefined_rule"}

Run = Callable[..., Awaitable[dict[str, Any]]]


def grammar_parity(specs: list[Any]) -> list[bool]:
    """Whether vLLM's guidance backend compiles the very grammar text our engine compiles, per spec."""
    from vllm.v1.structured_output.backend_guidance import serialize_guidance_grammar
    from vllm.v1.structured_output.request import get_structured_output_key

    from enclave_worker.engine.structured import GrammarCompiler
    from enclave_worker.vllm_engine.structured import vllm_structured

    ours = GrammarCompiler("{}", 1, (0,))  # grammar text only: no tokenizer is built
    return [ours.grammar(s) == serialize_guidance_grammar(*get_structured_output_key(vllm_structured(s)))
            for s in specs]


async def structured_checks(engine: Any, tokenizer: Any, run: Run) -> dict[str, Any]:
    from enclave_worker.engine.config import SamplingParams
    from enclave_worker.engine.errors import InvalidRequestError
    from protocol.openai.constraints import named_call_arguments_constraint
    from protocol.sampling import StructuredOutput

    def prompt(text: str) -> list[int]:
        return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))

    schemas = [StructuredOutput("json_schema", json.dumps(schema)) for _, schema in SCHEMAS]
    tool = named_call_arguments_constraint({"function": {"name": "get_weather", "parameters": WEATHER_ARGS}})
    regex = StructuredOutput("regex", "(yes|no|maybe)")
    jobs = [run(engine, f"c{i}", prompt(ask(what)), SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=i,
                                                                     structured=spec))
            for i, ((what, _), spec) in enumerate(zip(SCHEMAS, schemas, strict=True))]
    jobs += [run(engine, f"f{i}", prompt(ask(what)), SamplingParams(max_tokens=32, temperature=1.0, seed=i))
             for i, (what, _) in enumerate(SCHEMAS[:FREE])]
    # ignore_eos too: a complete grammar ends the answer on vLLM as on our engine.
    jobs.append(run(engine, "rx", prompt("Yes or no?"), SamplingParams(max_tokens=16, temperature=1.0, seed=1,
                                                                       ignore_eos=True, structured=regex)))
    jobs.append(run(engine, "tool", prompt("Weather in Paris?"), SamplingParams(max_tokens=48, temperature=1.0,
                                                                                seed=3, structured=tool)))
    done = await asyncio.gather(*jobs)
    keep = ("text", "finish", "deltas")
    answers = [{k: r[k] for k in keep} for r in done]
    refused = {}
    for kind, spec in BAD.items():
        try:
            await run(engine, f"bad-{kind}", prompt("hi"), SamplingParams(structured=StructuredOutput(kind, spec)))
            refused[kind] = "answered"
        except InvalidRequestError as exc:
            refused[kind] = str(exc)
    after = await run(engine, "after", prompt("hi"), SamplingParams(max_tokens=4, temperature=0))
    return {"schemas": answers[:len(SCHEMAS)], "free": answers[len(SCHEMAS):len(SCHEMAS) + FREE],
            "regex": answers[-2], "tool": answers[-1], "refused": refused, "serving_after": after["finish"],
            "parity": grammar_parity([*schemas, regex, tool])}
