"""A model family's own tool-call syntax, rewritten inside the worker into the one the rest reads.

Families write calls differently (vLLM ships a parser for each):

- `hermes` (Qwen 2.5/3, SmolLM2, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- `llama3_json` (Llama 3.1-3.3): the whole answer is the call, `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`, several separated by `;`;
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, after any text.

Which one a model uses is read from its own chat template (inside the tenant's signed package),
never guessed from an answer. Everything after the engine (the guard's tool-use controls, the
OpenAI layer in the worker or the gateway) reads one syntax, hermes (`protocol/toolcalls.py`): so
the calls the guard judges are, by construction, the calls the client gets (issue #12). The
`NativeToolCalls` converter rewrites each family's answer as it streams: each call's JSON object
is copied byte for byte into a `<tool_call>` block, text outside calls is kept, the markers and
separators are dropped (for hermes only whitespace changes). A call that is not a well-formed call
to one of the request's tools (bad JSON, an unknown name, arguments that are not an object, cut off
before it closes) is a `ToolCallSyntaxError`: the answer fails with a clear error rather than
passing the call on as text. A template that says nothing about calls (SmolLM2's) gets the worker's
own hermes instructions and keeps the lenient reading of protocol/toolcalls.py (`WORKER_HERMES`).

Forced calls: the gateway's assistant prefix (`protocol/openai/format.py::tool_prefix`) is in the
hermes syntax; the prompt gets the family's own opening instead (`native_prefix`), and the
constraint for `tool_choice: required` names the family's argument key (`native_structured`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from enclave_worker.engine.config import RequestOutput
from enclave_worker.engine.errors import InvalidRequestError
from protocol.sampling import StructuredOutput
from protocol.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

HERMES, LLAMA3_JSON, MISTRAL = "hermes", "llama3_json", "mistral"
PYTHON_TAG, MISTRAL_MARKER = "<|python_tag|>", "[TOOL_CALLS]"
_CANONICAL_OPENING = TOOL_CALL_OPEN + "\n"  # what tool_prefix starts a forced call with


class ToolCallSyntaxError(ValueError):
    """The model's answer holds a tool call that is not a well-formed call to one of the request's tools."""


@dataclass(frozen=True)
class ToolCallSyntax:
    name: str
    marker: str | None  # the text (often one special token) that opens the calls
    args_key: str  # the key the family's template asks the arguments under
    checked: bool = True  # answers go through NativeToolCalls (rewritten, each call validated)


SYNTAXES = {s.name: s for s in (ToolCallSyntax(HERMES, TOOL_CALL_OPEN, "arguments"),
                                ToolCallSyntax(LLAMA3_JSON, PYTHON_TAG, "parameters"),
                                ToolCallSyntax(MISTRAL, MISTRAL_MARKER, "arguments"))}
# A template that says nothing about calls (SmolLM2's): the worker's own hermes instructions, and
# the lenient reading protocol/toolcalls.py documents (a cut-off call repaired, unknown names dropped).
WORKER_HERMES = ToolCallSyntax(HERMES, TOOL_CALL_OPEN, "arguments", checked=False)


def syntax_for_template(chat_template: str | None) -> ToolCallSyntax:
    """The family's syntax, from what its chat template teaches the model. A template that says
    nothing about calls gets the worker's own hermes instructions (enclave_worker/chat_format.py)."""
    text = chat_template or ""
    if MISTRAL_MARKER in text:
        return SYNTAXES[MISTRAL]
    if TOOL_CALL_OPEN in text:
        return SYNTAXES[HERMES]
    if PYTHON_TAG in text or ('"parameters"' in text and "ipython" in text):
        return SYNTAXES[LLAMA3_JSON]
    return WORKER_HERMES


def native_prefix(syntax: ToolCallSyntax, prefix: str) -> str:
    """The family's own opening for the gateway's forced-call prefix (hermes), as the prompt ends."""
    if syntax.name == HERMES or not prefix.startswith(_CANONICAL_OPENING):
        return prefix
    rest = prefix[len(_CANONICAL_OPENING):]  # "" (required) or '{"name": "<name>", "arguments": ' (named)
    if syntax.name == MISTRAL:
        return MISTRAL_MARKER + "[" + rest
    if rest.endswith('"arguments": '):
        rest = rest[:-len('"arguments": ')] + f'"{syntax.args_key}": '
    return rest


def native_structured(syntax: ToolCallSyntax, prefix: str, structured: StructuredOutput | None
                      ) -> StructuredOutput | None:
    """The constraint of a forced call in the family's syntax. Under `required` the constraint is
    the call object (protocol/openai/constraints.py::tool_call_constraint): Llama names its
    arguments "parameters". A named call's constraint (its arguments, then "}") is the same in each.
    An auto answer's grammar (protocol/openai/tool_grammar.py: no prefix, a Lark grammar) switches on
    at the hermes opener: another family's is refused rather than left unconstrained."""
    if structured is not None and not prefix and structured.kind == "lark" and syntax.name != HERMES:
        raise InvalidRequestError(f"strict tools, response_format beside tools and parallel_tool_calls false "
                                  f"are enforced for models that write hermes tool calls; this model writes "
                                  f"{syntax.name}")
    if (structured is None or syntax.args_key == "arguments" or prefix != _CANONICAL_OPENING
            or structured.kind != "json_schema"):
        return structured
    schema = json.loads(structured.spec)
    for call in schema.get("anyOf", [schema]):
        props = call.get("properties", {})
        if "arguments" in props:
            props[syntax.args_key] = props.pop("arguments")
            call["required"] = [syntax.args_key if k == "arguments" else k for k in call.get("required", [])]
    return replace(structured, spec=json.dumps(schema, ensure_ascii=False))


# Converter states.
_START, _CONTENT, _LIST, _BETWEEN, _OBJECT, _CLOSE = range(6)


@dataclass
class NativeToolCalls:
    """One answer's converter: `feed(text)` takes the next piece of the native answer and returns
    the next piece of its hermes rewriting; `finish()` the rest, at its end. Each call's object is
    validated when it closes; a malformed one raises ToolCallSyntaxError."""

    syntax: ToolCallSyntax
    tool_names: frozenset[str]
    _state: int = _START
    _held: str = ""  # text not yet sure to be content (a tail that may open the calls)
    _tail: str = ""  # the end of the content written so far
    _object: str = ""  # the call object being copied
    _depth: int = 0
    _in_str: bool = False
    _esc: bool = False
    _calls: int = 0
    _open_written: bool = False  # the gateway's prefix already opened the next block

    def prime(self, native: str, opened: bool) -> None:
        """Take the prompt's forced opening (`native_prefix`), whose hermes form the gateway
        already put in front of the answer; `opened`: that form opens a block."""
        self.feed(native)
        self._open_written = opened and self._state in (_START, _LIST, _BETWEEN)

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            self._step(ch, out)
        return "".join(out)

    def finish(self) -> str:
        """The end of the answer: held content is released; an open call is an error."""
        if self._state == _OBJECT:
            raise ToolCallSyntaxError("the model's tool call was cut off before it closed")
        if self._state == _CLOSE:  # ended after the object (`</tool_call>` may be a stop string): closed
            return ""
        if self._open_written or (self._state in (_LIST, _BETWEEN) and not self._calls):
            raise ToolCallSyntaxError("the model opened a tool call and wrote none")
        held, self._held = self._held, ""
        return self._content(held) if self._state in (_START, _CONTENT) else ""

    def _step(self, ch: str, out: list[str]) -> None:
        state = self._state
        if state == _OBJECT:
            self._copy(ch, out)
        elif state in (_START, _CONTENT):
            self._text(ch, out)
        elif state == _CLOSE:
            self._close(ch)
        elif ch.isspace():
            pass
        elif ch == "{":
            self._open(out)
        elif state == _LIST and ch == "[" and self.syntax.name == MISTRAL:
            self._state = _BETWEEN
        elif state == _BETWEEN and self._calls and ch == (";" if self.syntax.name == LLAMA3_JSON else ","):
            pass
        elif state == _BETWEEN and self.syntax.name == MISTRAL and ch == "]":
            self._state = _CONTENT  # text may follow the list (and another list)
        else:
            raise ToolCallSyntaxError(f"the model's tool calls are malformed (unexpected {ch!r})")

    def _text(self, ch: str, out: list[str]) -> None:
        """Text outside calls: content, unless it opens the calls."""
        held = self._held + ch
        marker = self.syntax.marker or ""
        if self._state == _START and self.syntax.name == LLAMA3_JSON:
            stripped = held.lstrip()
            if not stripped or marker.startswith(stripped):
                self._held = held
                if stripped == marker:
                    self._held, self._state = "", _BETWEEN
                return
            if stripped == "{":
                self._held = ""
                self._open(out)
                return
            if self._open_written:
                raise ToolCallSyntaxError("the model wrote text where its forced tool call belongs")
            self._state = _CONTENT  # the answer is text: Llama writes a call only as the whole answer
            self._held = ""
            out.append(self._content(held))
            return
        if self.syntax.name in (MISTRAL, HERMES):
            at = held.find(marker)
            if at >= 0:
                out.append(self._content(held[:at]))
                self._held, self._state = "", _LIST
                return
            keep = _partial(held, marker)
            self._held = held[len(held) - keep:] if keep else ""
            out.append(self._content(held[:len(held) - keep]))
            return
        self._held = ""
        out.append(self._content(held))

    def _content(self, text: str) -> str:
        window = self._tail + text  # the marker may arrive split across pieces
        self._tail = window[-(len(TOOL_CALL_CLOSE) - 1):]
        if TOOL_CALL_OPEN in window or TOOL_CALL_CLOSE in window:
            # Only the family's own syntax makes a call: this text would read as one after the rewrite.
            raise ToolCallSyntaxError(f"the model wrote {TOOL_CALL_OPEN!r} as text, which this model's syntax "
                                      f"({self.syntax.name}) does not use")
        return text

    def _open(self, out: list[str]) -> None:
        self._state, self._object, self._depth, self._in_str, self._esc = _OBJECT, "", 0, False, False
        self._tail = ""
        if not self._open_written:
            out.append(TOOL_CALL_OPEN)
        self._open_written = False
        self._copy("{", out)

    def _copy(self, ch: str, out: list[str]) -> None:
        self._object += ch
        if self._in_str:
            if self._esc:
                self._esc = False
            elif ch == "\\":
                self._esc = True
            elif ch == '"':
                self._in_str = False
        elif ch == '"':
            self._in_str = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
        if self._object.endswith((TOOL_CALL_OPEN, TOOL_CALL_CLOSE)):  # the rewrite would end or open a block here
            raise ToolCallSyntaxError("the model's tool call holds a tool-call marker")
        out.append(ch)
        if self._depth == 0:
            self._check(self._object)
            self._calls += 1
            self._state = _CLOSE if self.syntax.name == HERMES else _BETWEEN
            out.append(TOOL_CALL_CLOSE)

    def _close(self, ch: str) -> None:
        """Hermes: after a call's object, only whitespace and `</tool_call>` (one call per block)."""
        held = self._held + ch
        if not held.strip():
            self._held = held
            return
        closing = held.lstrip()
        if not TOOL_CALL_CLOSE.startswith(closing):
            raise ToolCallSyntaxError("the model's tool call block holds more than one call object")
        self._held = held
        if closing == TOOL_CALL_CLOSE:
            self._held, self._state, self._tail = "", _CONTENT, ""

    def _check(self, body: str) -> None:
        try:
            call = json.loads(body)
        except ValueError:
            raise ToolCallSyntaxError("the model's tool call is not valid JSON") from None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ToolCallSyntaxError("the model's tool call has no function name")
        if self.tool_names and call["name"] not in self.tool_names:
            raise ToolCallSyntaxError(f"the model called {call['name']!r}, which is not one of the request's tools")
        args = call.get(self.syntax.args_key, call.get("arguments", call.get("parameters", {})))
        if not isinstance(args, dict):
            raise ToolCallSyntaxError("the model's tool call arguments are not a JSON object")


def _partial(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


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
    """A delta's text with the marker token's text back where the token was."""
    if marker_id is None or marker_id not in delta_ids:
        return delta_text
    k = list(delta_ids).index(marker_id)
    before = tokenizer.decode(list(delta_ids[:k])) if k else ""
    at = len(before) if delta_text.startswith(before) else 0
    return delta_text[:at] + marker + delta_text[at:]


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
