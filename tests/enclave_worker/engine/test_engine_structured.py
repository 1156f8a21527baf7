"""Constrained decoding: every answer of the real model at temperature 1 validates against its JSON
schema, over 30+ schemas (tests/enclave_worker/schema_suite.py, shared with the vLLM backend's
tests) batched through the engine together; the same requests unconstrained do not (so this suite
can fail)."""

from __future__ import annotations

import asyncio
import json

import pytest

from enclave_worker.engine import InvalidRequestError, SamplingParams
from protocol.sampling import StructuredOutput
from tests.enclave_worker.schema_suite import FREE, MAX_TOKENS, SCHEMAS, I, ask, valid


@pytest.fixture(scope="module")
def wide(make_engine):
    """One engine that takes every schema's request in the same steps."""
    return make_engine(max_num_seqs=len(SCHEMAS), kv_cache_memory_bytes=128 << 20)


def _prompt(engine, what: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": ask(what)}]))


def test_every_constrained_answer_validates_and_unconstrained_ones_do_not(wide, h):
    reqs = []
    for i, (what, schema) in enumerate(SCHEMAS):
        structured = StructuredOutput("json_schema", json.dumps(schema))
        reqs.append((f"c{i}", _prompt(wide, what), SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=i,
                                                                  structured=structured)))
    for i, (what, _) in enumerate(SCHEMAS[:FREE]):  # the same, free: a test that could not fail checks nothing
        reqs.append((f"f{i}", _prompt(wide, what), SamplingParams(max_tokens=32, temperature=1.0, seed=i)))
    outs = h.run_sync(wide, reqs)
    texts = {rid: "".join(o.delta_text for o in v) for rid, v in outs.items()}
    bad = [(SCHEMAS[i][0], texts[f"c{i}"]) for i in range(len(SCHEMAS)) if not valid(texts[f"c{i}"], SCHEMAS[i][1])]
    assert not bad, bad
    assert all(outs[f"c{i}"][-1].finish_reason == "stop" for i in range(len(SCHEMAS)))  # complete, not cut off
    free_bad = sum(not valid(texts[f"f{i}"], SCHEMAS[i][1]) for i in range(FREE))
    assert free_bad >= 4, texts


def test_streamed_deltas_make_a_valid_answer(wide):
    """Through the async API, as the worker streams: every delta is a prefix of a valid document."""
    picked = [SCHEMAS[i] for i in (1, 10, 14, 27)]

    async def one(i: int, what: str, schema: dict) -> list[str]:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=100 + i,
                                structured=StructuredOutput("json_schema", json.dumps(schema)))
        return [o.delta_text async for o in wide.generate(f"s{i}", _prompt(wide, what), params)]

    async def run() -> list[list[str]]:
        return await asyncio.gather(*(one(i, w, s) for i, (w, s) in enumerate(picked)))

    for (_, schema), deltas in zip(picked, asyncio.run(run()), strict=True):
        assert len(deltas) > 1 and valid("".join(deltas), schema), deltas


LIST = {"$ref": "#/$defs/node", "$defs": {"node": {  # recursion: a node refers to itself
    "type": "object", "properties": {"value": I, "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
    "required": ["value", "next"], "additionalProperties": False}}}


def test_a_recursive_schema_takes_nesting_to_any_depth_and_nothing_else(wide):
    """Sampled, a 135M model nests a recursive schema until max_tokens (it never picks null), so the
    grammar itself is checked: it takes a document four levels deep and refuses a wrong one."""
    good = '{"value": 1, "next": {"value": 2, "next": {"value": 3, "next": {"value": 4, "next": null}}}}'
    assert valid(good, LIST)
    for doc, accepted in ((good, True), ('{"value": 1, "next": {"value": "x"', False)):
        state = wide.grammars.matcher(StructuredOutput("json_schema", json.dumps(LIST)))
        ids = wide.tokenizer.encode(doc)
        done = [state.advance(t) for t in ids]
        assert (not state.matcher.is_error() and done[-1]) is accepted, doc


def test_regex_and_a_grammar_that_cannot_be_built(wide, h):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1,
                            structured=StructuredOutput("regex", "(yes|no|maybe)"))
    out = h.run_sync(wide, [("r", _prompt(wide, "yes or no"), params)])["r"]
    assert "".join(o.delta_text for o in out) in {"yes", "no", "maybe"} and out[-1].finish_reason == "stop"
    for spec in (StructuredOutput("json_schema", "{not json"), StructuredOutput("regex", "(unclosed"),
                 StructuredOutput("lark", "start: undefined_rule")):
        with pytest.raises(InvalidRequestError):
            wide.add_request("bad", [1, 2], SamplingParams(structured=spec), lambda _: None)
    assert not wide.has_unfinished_requests()


def test_the_tokenizer_and_token_tables_are_built_at_the_first_constrained_request(make_engine):
    """Not at boot (llguidance's tokenizer build holds the GIL for seconds: docs/engine.md): an engine
    has neither until a request asks for structured output; an unconstrained one builds nothing."""
    engine = make_engine(max_num_seqs=2, kv_cache_memory_bytes=32 << 20)
    compiler = engine.grammars
    assert compiler._tokenizer is None and not compiler._built
    engine.add_request("plain", [1, 2], SamplingParams(max_tokens=1), lambda _: None)
    assert compiler._tokenizer is None and not compiler._built
    engine.add_request("json", [1, 2], SamplingParams(max_tokens=1, structured=StructuredOutput(
        "json_schema", '{"type": "object"}')), lambda _: None)
    assert compiler._tokenizer is not None and len(compiler._built) == 1
