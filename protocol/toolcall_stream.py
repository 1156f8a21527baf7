"""Tool calls in an answer that is still being generated: where each call's name and arguments are.

The worker's guard and the OpenAI layer both read a streamed answer through `scan`, and `scan`
finds the blocks exactly where `protocol.toolcalls.parse_tool_calls` finds them (the same regular
expression), so the call the guard judged by its name is the call the client is sent, fragment by
fragment. A block opening `{"name": "<name>", "arguments": {` ("parameters" is accepted too) is
*streamable*: its name is known before any argument byte exists, and its arguments can be sent as
they are generated. Any other block (a list of calls, the name after the arguments, arguments that
are not an object) is only complete, and judged, when it closes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from protocol.toolcalls import TOOL_CALL_BLOCK, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, GeneratedToolCall, block_calls

_OPENING = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


@dataclass(frozen=True)
class ScannedBlock:
    """One `<tool_call>` block of the answer so far (positions index the scanned text)."""

    start: int  # where its `<tool_call>` marker starts
    end: int  # where the block ends so far: after `</tool_call>` if closed, else the text's end
    closed: bool
    body: str  # what parse_tool_calls decodes (whitespace-trimmed)
    name: str | None  # streamable blocks: the call's name, known before its arguments
    args_start: int | None  # streamable blocks: where the arguments object starts
    args_end: int | None  # streamable blocks: after the arguments' closing brace, once written

    @property
    def streamable(self) -> bool:
        return self.name is not None

    def args_upto(self, text: str) -> int:
        """How far the arguments may be sent so far: to their closing brace once written; before
        that, up to the text's end but never a tail that may be the start of `</tool_call>` (the
        parser ends the block there, even inside a string)."""
        assert self.args_start is not None
        if self.args_end is not None:
            return self.args_end
        if self.closed:
            return text.rfind(TOOL_CALL_CLOSE, self.start, self.end)
        return self.end - _partial_marker(text[:self.end], TOOL_CALL_CLOSE)

    def calls(self) -> tuple[GeneratedToolCall, ...]:
        """The calls in this block as `parse_tool_calls` reads them (for a block still open: as it
        would read them if the answer ended here)."""
        return tuple(block_calls(self.body))


@dataclass(frozen=True)
class Scan:
    blocks: tuple[ScannedBlock, ...]
    content_end: int  # the text before the first block that is surely no part of one

    def content_after(self, text: str, pos: int) -> int:
        """From `pos` (outside any block), how far the text is surely no part of a block."""
        nxt = [b.start for b in self.blocks if b.start >= pos]
        if nxt:
            return nxt[0]
        return len(text) - _partial_marker(text, TOOL_CALL_OPEN)


def scan(text: str) -> Scan:
    blocks = []
    for m in TOOL_CALL_BLOCK.finditer(text):
        closed = m.group(0).endswith(TOOL_CALL_CLOSE)
        end = m.end() if closed else len(text)
        name = args_start = args_end = None
        body_start = m.start(1)
        opening = _OPENING.match(text, body_start, m.end(1) if closed else len(text))
        if opening is not None:
            try:
                decoded = json.loads(opening.group(1))
            except ValueError:
                decoded = None
            if isinstance(decoded, str):
                name, args_start = decoded, opening.end()
                args_end = _object_end(text, args_start, m.end(1) if closed else len(text))
        blocks.append(ScannedBlock(m.start(), end, closed, m.group(1), name, args_start, args_end))
    first = blocks[0].start if blocks else len(text) - _partial_marker(text, TOOL_CALL_OPEN)
    return Scan(tuple(blocks), first)


def outside_content(text: str, final: bool = True) -> str:
    """The answer's text outside its tool-call blocks, as an OpenAI message with tool calls carries it
    (streamed or not: protocol/openai/format.py, tool_deltas.py): the pieces before, between and
    after the blocks, each trimmed of the whitespace that touches a block, empty pieces left out,
    joined by newlines, with no trailing whitespace. For an answer still being generated (`final`
    False): the part of that which can no longer change, which is a prefix of the final one (no
    tail that may open a block; no trailing whitespace, which a block or the end would trim)."""
    found = scan(text)
    pieces: list[str] = []
    pos, after_block = 0, False
    for block in found.blocks:
        piece = text[pos:block.start]
        pieces.append((piece.lstrip() if after_block else piece).rstrip())
        if not block.closed:  # an open block runs to the end of the answer
            return "\n".join(p for p in pieces if p)
        pos, after_block = block.end, True
    tail = text[pos:len(text) if final else found.content_after(text, pos)]
    pieces.append((tail.lstrip() if after_block else tail).rstrip())
    return "\n".join(p for p in pieces if p)


def _partial_marker(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _object_end(text: str, start: int, limit: int) -> int | None:
    """After the JSON object starting at `start` closes, if it closes before `limit`."""
    depth, in_str, esc = 0, False, False
    for i in range(start, limit):
        ch = text[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
