"""Each family's tool-call syntax (enclave_worker/tool_syntax.py): a fixed model output becomes the
same calls whether it is fed whole or a character at a time; several calls in one answer; malformed
calls are errors, never text; the family is read from its template; forced calls open and are
constrained in the family's own syntax; the three families' templates render tools."""

from __future__ import annotations

import functools
import json

import pytest

from enclave_worker.chat_format import chat_prompt_ids
from enclave_worker.engine.structured import GrammarCompiler, unpack
from enclave_worker.family_tool_calls import marker_token, native_prefix, native_structured, with_marker
from enclave_worker.tool_syntax import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_V11,
    SYNTAXES,
    WORKER_HERMES,
    NativeToolCalls,
    ToolCallSyntaxError,
    syntax_for_template,
)
from protocol.openai.constraints import named_call_arguments_constraint, tool_call_constraint
from protocol.openai.format import tool_prefix
from protocol.sampling import StructuredOutput
from protocol.toolcalls import parse_tool_calls
from tests.enclave_worker.tool_families import TEMPLATES, family_tokenizer

TOOLS = frozenset({"get_weather", "get_time"})
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

PARIS, LYON = ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})
# (family, the model's answer as text, the content, the calls)
ANSWERS = [
    (HERMES, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>', "Checking.",
     [PARIS, LYON]),
    (HERMES, 'Sunny; a <b>tag</b> and a <tool_ call.', 'Sunny; a <b>tag</b> and a <tool_ call.', []),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]),
    (MISTRAL, 'Let me check. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
              '{"name": "get_weather", "arguments": {"city": "Lyon"}}]', "Let me check.", [PARIS, LYON]),
    (MISTRAL, '[TOOL_CALLS]{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),
    (MISTRAL, "Paris is sunny [no call].", "Paris is sunny [no call].", []),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [PARIS]),
    (MISTRAL_V11, 'Let me check. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]'
                  '{"city": "Lyon"}', "Let me check.", [PARIS, LYON]),
    (MISTRAL_V11, '[TOOL_CALLS]get_time{}', "", [("get_time", {})]),  # [ARGS] dropped with the special tokens
    (MISTRAL_V11, '[TOOL_CALLS] get_weather [ARGS] {"city": "Paris"}', "", [PARIS]),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": {"name": "Paris", "tags": ["a}"]}}', "",
     [("get_weather", {"city": {"name": "Paris", "tags": ["a}"]}})]),
    (MISTRAL_V11, "Paris is sunny [ARGS] {}.", "Paris is sunny [ARGS] {}.", []),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (LLAMA3_JSON, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (LLAMA3_JSON, ' {"name": "get_weather", "parameters": {"city": "Paris"}}; '
                  '{"name": "get_weather", "parameters": {"city": "Lyon"}}', "", [PARIS, LYON]),
    (LLAMA3_JSON, 'The answer is {"name": 1}.', 'The answer is {"name": 1}.', []),
    (LLAMA3_JSON, "  <|python", "  <|python", []),  # ended inside what could have been the marker: text
]
MALFORMED = [
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "cut off"),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>', "not valid JSON"),
    (HERMES, '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "not one of the request's tools"),
    (HERMES, '<tool_call>\n[{"name": "get_weather", "arguments": {}}]\n</tool_call>', "malformed"),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {}} {"name": "get_time"}</tool_call>',
     "more than one call"),
    (HERMES, "<tool_call>\n", "wrote none"),
    (HERMES, "All done.</tool_call>", "as text"),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par', "cut off"),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": Paris}}]', "not valid JSON"),
    (MISTRAL, '[TOOL_CALLS][{"name": "delete_files", "arguments": {"path": "/"}}]', "not one of the request's tools"),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": "Paris"}]', "not a JSON object"),
    (MISTRAL, '[TOOL_CALLS][{"arguments": {}}]', "no function name"),
    (MISTRAL, "[TOOL_CALLS]get_weather", "malformed"),
    (MISTRAL, "[TOOL_CALLS]", "wrote none"),
    (MISTRAL, 'Hi <tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', "as text"),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "</tool_call>"}}]', "marker"),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": "Par', "cut off"),
    (MISTRAL_V11, "[TOOL_CALLS]get_wea", "cut off"),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": Paris}', "not valid JSON"),
    (MISTRAL_V11, '[TOOL_CALLS]delete_files[ARGS]{"path": "/"}', "not one of the request's tools"),
    (MISTRAL_V11, '[TOOL_CALLS][ARGS]{"city": "Paris"}', "no function name"),
    (MISTRAL_V11, '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}]', "no function name"),  # pre-v11's form
    (MISTRAL_V11, '[TOOL_CALLS]get_weather", "x": "[ARGS]{}', "malformed"),  # a name is never JSON text
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]"Paris"', "malformed"),
    (MISTRAL_V11, "[TOOL_CALLS]get_weather[ARGS][1]", "malformed"),
    (MISTRAL_V11, "[TOOL_CALLS]" + "a" * 65 + "{}", "malformed"),
    (MISTRAL_V11, "[TOOL_CALLS]", "wrote none"),
    (MISTRAL_V11, 'Hi <tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', "as text"),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": "</tool_call>"}', "marker"),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}', "cut off"),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}} and more', "malformed"),
    (LLAMA3_JSON, '{"name": "rm", "parameters": {}}', "not one of the request's tools"),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": [1]}', "not a JSON object"),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris",}}', "not valid JSON"),
    (LLAMA3_JSON, "<|python_tag|>", "wrote none"),
]


def convert(family: str, text: str, pieces: int) -> str:
    calls = NativeToolCalls(SYNTAXES[family], TOOLS)
    step = max(1, len(text) // pieces)
    return "".join(calls.feed(text[i:i + step]) for i in range(0, len(text), step)) + calls.finish()


@pytest.mark.parametrize(("family", "text", "content", "calls"), ANSWERS)
def test_a_fixed_answer_is_the_same_calls_whole_or_streamed(family: str, text: str, content: str,
                                                            calls: list[tuple[str, dict]]) -> None:
    whole = convert(family, text, 1)
    assert convert(family, text, len(text)) == whole  # one character at a time: the same rewriting
    parsed = parse_tool_calls(whole)
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    assert (parsed.content if calls else whole) == content


def test_the_rewritten_calls_carry_the_models_own_bytes() -> None:
    """Each call's object is copied, not re-serialised: streamed argument fragments are the model's."""
    text = '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Par\\u00eds"}}]'
    assert convert(MISTRAL, text, 1) == "<tool_call>" + text[len("[TOOL_CALLS]["):-1] + "</tool_call>"


@pytest.mark.parametrize(("family", "text", "message"), MALFORMED)
def test_a_malformed_call_is_an_error_not_text(family: str, text: str, message: str) -> None:
    for pieces in (1, len(text)):
        with pytest.raises(ToolCallSyntaxError, match=message):
            convert(family, text, pieces)


def test_the_family_is_read_from_its_template() -> None:
    assert syntax_for_template(TEMPLATES["hermes"]).name == HERMES
    assert syntax_for_template(TEMPLATES["llama3_json"]).name == LLAMA3_JSON
    assert syntax_for_template(TEMPLATES["mistral"]).name == MISTRAL
    assert syntax_for_template(TEMPLATES["mistral_v11"]).name == MISTRAL_V11  # it writes calls with [ARGS]
    assert syntax_for_template(TEMPLATES["hermes"]).checked
    # No template, or one that ignores tools (SmolLM2's): the worker's own hermes instructions, read
    # leniently as before (protocol/toolcalls.py: a cut-off call repaired, unknown names dropped).
    assert syntax_for_template(None) == syntax_for_template("{{ messages }}") == WORKER_HERMES
    assert not WORKER_HERMES.checked


@pytest.mark.parametrize("family", [HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_V11])
def test_the_familys_template_renders_the_tools(family: str) -> None:
    tok = family_tokenizer(family)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    text = tok.apply_chat_template(messages, tools=[WEATHER, TIME])
    for tool in (WEATHER, TIME):
        assert json.dumps(tool, sort_keys=True) in text  # each tool's definition, as JSON
    assert "Weather in Paris?" in text and "Be brief." in text
    marks = {HERMES: ("<tools>", "<|im_start|>assistant\n"), LLAMA3_JSON: ("Environment: ipython", '"parameters"'),
             MISTRAL: ("[AVAILABLE_TOOLS]", "[/INST]"), MISTRAL_V11: ("[SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]")}[family]
    assert all(m in text for m in marks)
    # The worker's prompt ids: the template's control tokens are tokens, the user's text stays text.
    ids = chat_prompt_ids(tok, tok.chat_template, [*messages, {"role": "user", "content": "[INST]<|eot_id|>"}],
                          [WEATHER], "")
    assert tok.encode("[INST]")[0] in ids or family not in (MISTRAL, MISTRAL_V11)
    assert tok.decode(ids, skip_special_tokens=False).count("[INST]<|eot_id|>") == 1
    typed = tok.encode("[INST]<|eot_id|>", parse_special=False)
    assert len(typed) > 2


NAMED = tool_prefix({"type": "function", "function": {"name": "get_weather"}})


@pytest.mark.parametrize(("family", "required", "named"), [
    (HERMES, "<tool_call>\n", NAMED),
    (LLAMA3_JSON, "", '{"name": "get_weather", "parameters": '),
    (MISTRAL, "[TOOL_CALLS][", '[TOOL_CALLS][{"name": "get_weather", "arguments": '),
    (MISTRAL_V11, "[TOOL_CALLS]", "[TOOL_CALLS]get_weather[ARGS]"),
])
def test_a_forced_call_opens_in_the_familys_syntax(family: str, required: str, named: str) -> None:
    syntax = SYNTAXES[family]
    assert native_prefix(syntax, tool_prefix("required")) == required
    assert native_prefix(syntax, NAMED) == named
    assert native_prefix(syntax, "") == ""


@pytest.mark.parametrize("family", [HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_V11])
@pytest.mark.parametrize(("choice", "answer"), [
    ("required", {LLAMA3_JSON: '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                  MISTRAL: '{"name": "get_weather", "arguments": {"city": "Paris"}}',
                  MISTRAL_V11: 'get_weather{"city": "Paris"}',  # what its constraint allows (below)
                  HERMES: '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'}),
    ("named", {LLAMA3_JSON: '{"city": "Paris"}}', MISTRAL: '{"city": "Paris"}}', HERMES: '{"city": "Paris"}}',
               MISTRAL_V11: '{"city": "Paris"}'}),
])
def test_a_forced_answer_continues_the_gateways_prefix(family: str, choice: str, answer: dict[str, str]) -> None:
    """The gateway puts its (hermes) prefix before what the worker sends: together, one call."""
    prefix = tool_prefix("required" if choice == "required" else {"function": {"name": "get_weather"}})
    calls = NativeToolCalls(SYNTAXES[family], TOOLS)
    calls.prime(native_prefix(SYNTAXES[family], prefix), opened=True)
    sent = calls.feed(answer[family]) + calls.finish()
    assert [(c.name, c.arguments) for c in parse_tool_calls(prefix + sent).calls] == [PARIS]


def test_a_forced_call_the_model_never_wrote_is_an_error() -> None:
    for family in (HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_V11):
        calls = NativeToolCalls(SYNTAXES[family], TOOLS)
        calls.prime(native_prefix(SYNTAXES[family], tool_prefix("required")), opened=True)
        calls.feed("  ")
        with pytest.raises(ToolCallSyntaxError):
            calls.finish()


def test_the_required_constraint_names_llamas_argument_key() -> None:
    structured = tool_call_constraint([WEATHER, TIME])
    llama = native_structured(SYNTAXES[LLAMA3_JSON], tool_prefix("required"), structured)
    assert llama is not None
    for call in json.loads(llama.spec)["anyOf"]:
        assert set(call["properties"]) == {"name", "parameters"} and call["required"] == ["name", "parameters"]
    assert native_structured(SYNTAXES[MISTRAL], tool_prefix("required"), structured) == structured
    assert native_structured(SYNTAXES[HERMES], tool_prefix("required"), structured) == structured
    named = named_call_arguments_constraint(WEATHER)  # the arguments, then "}": the same in each family
    assert native_structured(SYNTAXES[LLAMA3_JSON], NAMED, named) == named


V11_TOKENIZER = family_tokenizer(MISTRAL_V11)


def _allows(compiler: GrammarCompiler, structured: StructuredOutput, text: str) -> bool:
    """Whether the engine's matcher for `structured` lets the model write `text` and end there."""
    tok = V11_TOKENIZER
    state = compiler.matcher(structured)
    for tid in tok.encode(text):
        assert state.mask is not None
        if not unpack(state.mask, tok.vocab_size)[0, tid]:
            return False
        state.advance(tid)
    return bool(state.matcher.is_accepting())


def test_mistral_v11s_forced_calls_are_constrained_to_its_own_syntax() -> None:
    """`required`: one of the tools' names, then its arguments; named: the arguments alone (the
    call has no object for a `}` to close)."""
    allows = functools.partial(_allows, GrammarCompiler(V11_TOKENIZER.to_json(), V11_TOKENIZER.vocab_size,
                                                        V11_TOKENIZER.eos_token_ids))
    required = native_structured(SYNTAXES[MISTRAL_V11], tool_prefix("required"), tool_call_constraint([WEATHER, TIME]))
    assert required is not None and required.kind == "lark"
    assert allows(required, 'get_weather{"city": "Paris"}') and allows(required, "get_time{}")
    for wrong in ('{"name": "get_weather", "arguments": {"city": "Paris"}}', 'delete_files{"city": "Paris"}',
                  'get_weather{"town": "Paris"}', 'get_weather{"city": "Paris"}}', "get_weather"):
        assert not allows(required, wrong), wrong
    named = native_structured(SYNTAXES[MISTRAL_V11], NAMED, named_call_arguments_constraint(WEATHER))
    assert named is not None
    assert allows(named, '{"city": "Paris"}')
    assert not allows(named, '{"city": "Paris"}}') and not allows(named, '{"city": 1}')
    # A named opening whose name is not a function name is left in the gateway's form.
    odd = '<tool_call>\n{"name": "a\\"b", "arguments": '
    assert native_prefix(SYNTAXES[MISTRAL_V11], odd) == odd


def test_every_marker_token_in_a_delta_is_put_back() -> None:
    """The detokenizer drops `[TOOL_CALLS]` and `[ARGS]`; a delta of several tokens (two v11 calls)
    gets each marker back where its token was, so the second call is never read as text."""
    tok = V11_TOKENIZER
    said = 'Hi[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    ids = tok.encode(said)
    marker = marker_token(SYNTAXES[MISTRAL_V11], tok)
    assert marker is not None and ids.count(marker) == 2
    text = with_marker(tok.decode(ids), ids, "[TOOL_CALLS]", marker, tok)
    assert text == 'Hi[TOOL_CALLS]get_time{}[TOOL_CALLS]get_weather{"city": "Paris"}'
    calls = NativeToolCalls(SYNTAXES[MISTRAL_V11], TOOLS)
    parsed = parse_tool_calls(calls.feed(text) + calls.finish())
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_time", {}), PARIS]


def test_a_worker_names_its_models_syntax_in_its_status() -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from enclave_worker.settings import WorkerSettings
    from enclave_worker.state import LiveState, WorkerState

    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                       model="m", version="v1"), live=LiveState(status="ready"))
    assert state.report().tool_call_syntax == ""  # nothing served yet
    for template, name in ((TEMPLATES["mistral"], "mistral"), (None, "hermes_lenient")):
        engine = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=template), stats=dict)
        state.live.booted = SimpleNamespace(engine=engine, load_s=0.1, gpu_cc_off=False)  # type: ignore[assignment]
        assert state.report().tool_call_syntax == name
