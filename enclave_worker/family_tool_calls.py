"""A family's tool-call syntax (enclave_worker/tool_syntax.py) where it meets the gateway and the engine.

Forced calls: the gateway's assistant prefix (`protocol/openai/format.py::tool_prefix`) is in the
hermes syntax; the prompt gets the family's own opening instead (`native_prefix`), and the
constraint is the family's own (`native_structured`): Llama names its arguments "parameters";
Mistral v11 writes the tool's name, then its arguments. The engine's answer is rewritten as it
streams (`canonical_outputs`), with the family's marker token put back where the detokenizer
dropped it (`with_marker`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from enclave_worker.engine.config import RequestOutput
from enclave_worker.engine.errors import InvalidRequestError
from enclave_worker.tool_syntax import (
    HERMES,
    MISTRAL,
    MISTRAL_ARGS,
    MISTRAL_MARKER,
    MISTRAL_V11,
    TOOL_NAME,
    NativeToolCalls,
    ToolCallSyntax,
)
from protocol.sampling import StructuredOutput
from protocol.toolcalls import TOOL_CALL_OPEN

_CANONICAL_OPENING = TOOL_CALL_OPEN + "\n"  # what tool_prefix starts a forced call with
_NAMED_ARGUMENTS = '"arguments": '  # how tool_prefix's named opening ends
_NAMED_GRAMMAR_START = 'start: arguments "}"\n'  # constraints.py::named_call_arguments_constraint's first rule


def _named_tool(rest: str) -> str | None:
    """The tool a named opening (`{"name": "<name>", "arguments": `) names, if it is one."""
    if not rest.endswith(_NAMED_ARGUMENTS):
        return None
    try:
        call = json.loads(rest + "null}")
    except ValueError:
        return None
    name = call.get("name") if isinstance(call, dict) else None
    return name if isinstance(name, str) and TOOL_NAME.fullmatch(name) else None


def native_prefix(syntax: ToolCallSyntax, prefix: str) -> str:
    """The family's own opening for the gateway's forced-call prefix (hermes), as the prompt ends."""
    if syntax.name == HERMES or not prefix.startswith(_CANONICAL_OPENING):
        return prefix
    rest = prefix[len(_CANONICAL_OPENING):]  # "" (required) or '{"name": "<name>", "arguments": ' (named)
    if syntax.name == MISTRAL:
        return MISTRAL_MARKER + "[" + rest
    if syntax.name == MISTRAL_V11:
        if not rest:
            return MISTRAL_MARKER
        name = _named_tool(rest)
        return MISTRAL_MARKER + name + MISTRAL_ARGS if name is not None else prefix
    if rest.endswith(_NAMED_ARGUMENTS):
        rest = rest[:-len(_NAMED_ARGUMENTS)] + f'"{syntax.args_key}": '
    return rest


def native_structured(syntax: ToolCallSyntax, prefix: str, structured: StructuredOutput | None
                      ) -> StructuredOutput | None:
    """The constraint of a forced call in the family's syntax. Under `required` the constraint is
    the call object (protocol/openai/constraints.py::tool_call_constraint): Llama names its
    arguments "parameters"; Mistral v11 writes `name{arguments}` (one of the request's tools). A
    named call's constraint is its arguments, then the `}` that closes the object; Mistral v11's
    call has no object around its arguments, so its constraint ends with them. An auto answer's
    grammar (protocol/openai/tool_grammar.py: no prefix, a Lark grammar) switches on at the hermes
    opener: another family's is refused rather than left unconstrained."""
    if structured is None:
        return structured
    if not prefix and structured.kind == "lark" and syntax.name != HERMES:
        raise InvalidRequestError(f"strict tools, response_format beside tools and parallel_tool_calls false "
                                  f"are enforced for models that write hermes tool calls; this model writes "
                                  f"{syntax.name}")
    if syntax.name == MISTRAL_V11:
        if structured.kind == "lark" and structured.spec.startswith(_NAMED_GRAMMAR_START):
            return replace(structured, spec="start: arguments\n" + structured.spec[len(_NAMED_GRAMMAR_START):])
        if prefix == _CANONICAL_OPENING and structured.kind == "json_schema":
            return _v11_required(structured)
        return structured
    if syntax.args_key == "arguments" or prefix != _CANONICAL_OPENING or structured.kind != "json_schema":
        return structured
    schema = json.loads(structured.spec)
    for call in schema.get("anyOf", [schema]):
        props = call.get("properties", {})
        if "arguments" in props:
            props[syntax.args_key] = props.pop("arguments")
            call["required"] = [syntax.args_key if k == "arguments" else k for k in call.get("required", [])]
    return replace(structured, spec=json.dumps(schema, ensure_ascii=False))


def _v11_required(structured: StructuredOutput) -> StructuredOutput:
    """`tool_call_constraint`'s call objects as a grammar of Mistral v11 calls: a tool's name, then
    its arguments (the same compact JSON layout)."""
    layout = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
    schema = json.loads(structured.spec)
    rules, names = [], []
    for i, call in enumerate(schema.get("anyOf", [schema])):
        props = call.get("properties", {})
        name = props.get("name", {}).get("const")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            return structured  # not a call object of tool_call_constraint's: left as it is
        names.append(f"call{i}")
        rules.append(f"call{i}: {json.dumps(name)} args{i}\nargs{i}: %json "
                     + json.dumps({**props.get("arguments", {"type": "object"}), **layout}))
    return replace(structured, kind="lark", spec="start: " + " | ".join(names) + "\n" + "\n".join(rules))


def marker_token(syntax: ToolCallSyntax, tokenizer: Any) -> int | None:
    """The id of the family's marker where it is one special token, which detokenizing drops from
    the answer's text (vLLM's parsers ask for special tokens back; we put the marker back by id)."""
    if syntax.marker is None:
        return None
    ids = tokenizer.encode(syntax.marker)
    if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=True):
        return None
    return int(ids[0])


def with_marker(delta_text: str, delta_ids: Sequence[int], marker: str, marker_id: int | None, tokenizer: Any) -> str:
    """A delta's text with the marker token's text back wherever the token was (Mistral v11 writes
    one marker per call, and a delta may hold several tokens)."""
    if marker_id is None or marker_id not in delta_ids:
        return delta_text
    ids, places = list(delta_ids), []
    for k, tid in enumerate(ids):
        if tid == marker_id:
            before = tokenizer.decode(ids[:k]) if k else ""
            places.append(len(before) if delta_text.startswith(before) else 0)
    for at in reversed(places):
        delta_text = delta_text[:at] + marker + delta_text[at:]
    return delta_text


async def canonical_outputs(outputs: AsyncIterator[RequestOutput], syntax: ToolCallSyntax, tokenizer: Any,
                            tool_names: frozenset[str], prefix: str) -> AsyncGenerator[RequestOutput, None]:
    """The engine's outputs with their text rewritten into hermes (`NativeToolCalls`); `prefix` is
    the gateway's (hermes) forced-call prefix, whose native form ends the prompt."""
    calls = NativeToolCalls(syntax, tool_names)
    calls.prime(native_prefix(syntax, prefix), opened=prefix.rstrip().endswith(TOOL_CALL_OPEN))
    marker_id = marker_token(syntax, tokenizer)
    try:
        async for out in outputs:
            text = calls.feed(with_marker(out.delta_text, out.delta_token_ids, syntax.marker or "", marker_id,
                                          tokenizer))
            if out.finished:
                text += calls.finish()
            yield replace(out, delta_text=text)
    finally:
        if isinstance(outputs, AsyncGenerator):
            await outputs.aclose()
