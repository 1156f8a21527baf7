"""Hypothesis over the request fields the worker parses by hand (#35): mutated `messages_json`,
`tools_json`, prompts and assistant prefixes through `prompt_ids` (Generate and Tokenize), mutated
`SamplingParams` messages through `from_wire`, mutated structured-output specs through the engine's
grammar compiler, and token lists through Detokenize's check. Each raises only the typed refusal the
pipeline maps to 400 or 403 (InvalidRequestError, GuardRefusal, InvalidSamplingParams), never a crash.

A byte-level tokenizer of 258 tokens and a ChatML template (with and without native `tools`) keep
this fast; the rendering code is the same as with the real model's tokenizer."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from enclave_worker.engine import InvalidRequestError
from enclave_worker.engine.structured import GrammarCompiler
from enclave_worker.engine.tokenizer import Tokenizer
from enclave_worker.guard import GuardRefusal, WorkerGuard
from enclave_worker.render import prompt_ids
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2
from protocol.rpc.sampling import from_wire, to_wire
from protocol.sampling import InvalidSamplingParams, SamplingParams, StructuredOutput
from tests.fuzzing import DEEP_JSON, budget, mutated

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# A template that renders `tools` itself (the native path of chat_format.py).
CHATML_TOOLS = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
                "{% endif %}" + CHATML)

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "developer", "content": "Answer in English."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris? My mail is a@b.example"},
                                 {"type": "image_url", "image_url": {"url": "data:,"}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
]
PARAMETERS: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather by city",
                                           "parameters": PARAMETERS}}]
PARAMS = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, top_k=40, seed=7, stop=("\n\n",),
                        stop_token_ids=(257,), logprobs=2, presence_penalty=0.5, frequency_penalty=-0.5,
                        repetition_penalty=1.1, min_p=0.05, logit_bias=((12, -5.0), (40, 3.0)),
                        structured=StructuredOutput("json_schema", json.dumps(PARAMETERS)))
SPECS = {"json_schema": [json.dumps(PARAMETERS).encode(),
                         b'{"type":"array","items":{"type":"integer","minimum":0},"maxItems":3}'],
         "regex": [rb"[0-9]{3}-[A-Z]+(x|y)*"],
         "lark": [b'start: "yes" | "no" | NUMBER\nNUMBER: /[0-9]+/\n']}


def _tokenizer(template: str) -> Tokenizer:
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<|im_start|>": len(vocab), "<|im_end|>": len(vocab) + 1})
    hf = HFTokenizer(BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return Tokenizer(hf.to_str(), template, {"eos_token_id": vocab["<|im_end|>"]})


ENGINES = [SimpleNamespace(tokenizer=_tokenizer(t)) for t in (CHATML, CHATML_TOOLS)]
GUARD = WorkerGuard(PolicySet.from_dict({
    "policy_id": "p", "version": 1, "tenant": "acme",
    "data": {"pii_input": {"EMAIL_ADDRESS": "redact", "US_SSN": "block"},
             "blocked_patterns": {"secret": "s3cr[e3]t"}, "blocked_topics": {"birds": ["nightingale"]}}}))


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")  # a proto3 string field carries only valid UTF-8


@budget(300)
@given(mutated([json.dumps(MESSAGES).encode(), *DEEP_JSON]), mutated([json.dumps(TOOLS).encode(), b""]),
       st.sampled_from(["chat", "chat", "completion", ""]), st.text(max_size=64), st.text(max_size=8),
       st.booleans(), st.integers(0, 1))
def test_fuzz_prompt_fields(messages: bytes, tools: bytes, kind: str, prompt: str, prefix: str, guarded: bool,
                            which: int) -> None:
    request = worker_pb2.GenerateRequest(request_id="r", key_id="k", kind=kind, messages_json=_text(messages),
                                         tools_json=_text(tools), prompt=prompt, assistant_prefix=prefix)
    with contextlib.suppress(InvalidRequestError, GuardRefusal):
        ids = prompt_ids(ENGINES[which], GUARD if guarded else None, "m", request, [])
        assert ids and all(isinstance(i, int) for i in ids)


@budget(200)
@given(mutated([to_wire(PARAMS).SerializeToString(), to_wire(SamplingParams()).SerializeToString()]))
def test_fuzz_sampling_params(wire: bytes) -> None:
    try:
        message = worker_pb2.SamplingParams.FromString(wire)
    except DecodeError:
        return  # refused by gRPC's own deserializer before any of our code runs
    with contextlib.suppress(InvalidSamplingParams):
        assert isinstance(from_wire(message), SamplingParams)


@pytest.fixture(scope="module")
def grammars() -> GrammarCompiler:
    tok = ENGINES[0].tokenizer
    return GrammarCompiler(tok.to_json(), tok.vocab_size, tok.eos_token_ids)


@budget(40)
@given(st.sampled_from(sorted(SPECS)), st.data())
def test_fuzz_structured_specs(grammars: GrammarCompiler, kind: str, data: st.DataObject) -> None:
    spec = _text(data.draw(mutated(SPECS[kind])))
    with contextlib.suppress(InvalidSamplingParams):
        structured = StructuredOutput(kind, spec)
        with contextlib.suppress(InvalidRequestError):
            grammars.matcher(structured)


@budget(50)
@given(st.lists(st.integers(-2**63, 2**64), max_size=8))
def test_fuzz_detokenize_ids(ids: list[int]) -> None:
    tok = ENGINES[0].tokenizer
    with contextlib.suppress(InvalidRequestError):
        assert isinstance(tok.decode(tok.check_ids(ids), skip_special_tokens=False), str)
