"""Streamed tool calls in OpenAI's delta shape, as OpenAI and vLLM send them.

A call whose name the model writes first (`protocol/toolcall_stream.py`) is sent as it is generated:
one delta with its index, id, type and name (arguments ""), then its arguments in fragments, each
`{"index": i, "function": {"arguments": "<fragment>"}}`. Joined, the fragments are the arguments
the model wrote; a call cut off by max_tokens ends with the fragment that closes it as the whole
answer's parser repairs it. Any other call is sent whole when its block is complete. Only calls to
the request's tools are sent, as in the whole answer (protocol/openai/format.py::parse_tool_calls).
What reaches this layer has passed the worker's guard (enclave_worker/tool_stream.py): a call
leaves the worker only once its name is allowed, so no fragment of a refused call is ever here.

Content streams so that the deltas, joined, are the non-streamed message's content: before any call
is sent, the text before the first block (the whole answer, if no call is ever sent); once a call
is sent, the text outside the blocks, before, between and after them
(`protocol.toolcall_stream.outside_content`). Whitespace that a later block or the end may trim is
held until text follows it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from protocol.toolcall_stream import ScannedBlock, outside_content, scan


def _call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class _Streaming:
    index: int
    sent: int  # position in the answer up to which its arguments were sent


@dataclass
class ToolCallDeltas:
    """One choice's tool-call deltas. `feed` takes the whole answer so far (without the assistant
    prefix the gateway asked for) and returns the new content and the new tool-call deltas."""

    prefix: str
    tool_names: frozenset[str]
    count: int = 0  # calls sent so far
    _sent: str = ""  # the content sent so far
    _streaming: dict[int, _Streaming] = field(default_factory=dict)  # block start -> its state
    _done: set[int] = field(default_factory=set)  # blocks sent whole (or skipped)

    def feed(self, text: str, finished: bool) -> tuple[str, list[dict[str, Any]]]:
        """At the end (`finished`), the content returned completes the message's content."""
        full = self.prefix + text
        found = scan(full)
        deltas: list[dict[str, Any]] = []
        for block in found.blocks:
            if block.start in self._done:
                continue
            if block.name is not None:
                deltas.extend(self._stream(block, full, finished))
            elif block.closed or finished:
                self._done.add(block.start)
                for call in block.calls():
                    if call.name in self.tool_names:
                        deltas.append({"index": self._next(), "id": _call_id(), "type": "function",
                                       "function": {"name": call.name, "arguments": call.arguments_json()}})
        return self._content(text, full, found.content_end, finished), deltas

    def _content(self, text: str, full: str, first_block: int, finished: bool) -> str:
        if self.count:  # the message will carry calls: its content is the text outside them
            want = outside_content(full, final=finished)
        elif finished:  # no call: the answer as it is
            want = text
        else:  # no call yet: the text before the first block
            want = "" if self.prefix else text[:first_block].rstrip()
        if not want.startswith(self._sent):  # never: each `want` extends the last (outside_content)
            return ""
        new, self._sent = want[len(self._sent):], want
        return new

    def _next(self) -> int:
        self.count += 1
        return self.count - 1

    def _stream(self, block: ScannedBlock, full: str, finished: bool) -> list[dict[str, Any]]:
        assert block.name is not None and block.args_start is not None
        if block.name not in self.tool_names:
            self._done.add(block.start)
            return []
        deltas: list[dict[str, Any]] = []
        state = self._streaming.get(block.start)
        if state is None:
            state = self._streaming[block.start] = _Streaming(self._next(), block.args_start)
            deltas.append({"index": state.index, "id": _call_id(), "type": "function",
                           "function": {"name": block.name, "arguments": ""}})
        upto = block.args_upto(full)
        if upto > state.sent:
            deltas.append({"index": state.index, "function": {"arguments": full[state.sent:upto]}})
            state.sent = upto
        if block.closed or finished:
            self._done.add(block.start)
            calls = block.calls()
            sent = full[block.args_start:state.sent]
            if len(calls) == 1 and calls[0].name == block.name:
                whole = calls[0].arguments_json()
                if whole.startswith(sent) and len(whole) > len(sent):  # cut off: the repair's closing part
                    deltas.append({"index": state.index, "function": {"arguments": whole[len(sent):]}})
        return deltas
