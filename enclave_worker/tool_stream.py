"""The tenant's tool-use controls on an answer that streams: what of it may leave the worker so far.

Text outside tool-call blocks leaves as it is generated (never a tail that may open a block). A
block (`protocol/toolcall_stream.py`) is held until the guard has judged it:

- a call whose name comes first is judged as soon as its name is known, before any argument byte
  leaves, when its arguments cannot change the verdict (a tool outside the allowlist, or one with
  no argument schema beyond "an object" and no URL arguments): refused there, no byte of the call
  has left; allowed, its arguments leave as they are generated; held for approval, none of it ever
  leaves (the answer ends with finish_reason "requires_approval");
- any other call (arguments checked by a schema or a URL allowlist, or not written name first) is
  held whole until its block is complete, then judged with its arguments.

Every call counts against the request and session caps once, when it is judged. The calls judged
are exactly those `parse_tool_calls` reads from the whole answer (same blocks); a streamed block is
read again when it closes, and a block that turns out to hold another call is judged again as a
whole (a verdict that is not "allow" then refuses the answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from enclave_worker.guard import GuardNote, GuardRefusal, WorkerGuard
from policy.agents import ToolCall, ToolCallVerdict, args_decide, check_tool_call, refusal_message
from protocol.toolcall_stream import ScannedBlock, scan

STREAM, ALLOW, DROP = "stream", "allow", "drop"


@dataclass
class ToolCallRelease:
    """One answer's release cursor. `release(text, finished)` takes the whole answer so far (the
    assistant prefix included) and returns the part of it newly allowed to leave, prefix excluded."""

    guard: WorkerGuard
    key_id: str
    prefix: str
    killed: bool
    notes: list[GuardNote]
    held_for_approval: bool = False
    _pos: int = -1
    _pending: bool = False
    _silenced: bool = False  # the prefix's own call is held for approval: nothing of the answer leaves
    _decided: dict[int, str] = field(default_factory=dict)
    _counted: int = 0

    def __post_init__(self) -> None:
        self._pos = len(self.prefix)

    @property
    def holding(self) -> bool:
        """Whether some generated text has not been released (or never will be)."""
        return self._silenced or self._pending

    def release(self, text: str, finished: bool) -> str:
        out: list[str] = []
        pos, pending = self._pos, False
        for block in scan(text).blocks:
            if block.closed and block.end <= pos:
                continue  # released or dropped already
            if pos < block.start:
                out.append(text[pos:block.start])
                pos = block.start
            complete = block.closed or finished
            verdict = self._decide(block, complete)
            if verdict is None or (verdict == DROP and not complete):
                pending = True
                break
            if verdict == DROP:
                self._silenced = self._silenced or block.start < len(self.prefix)
                pos = block.end
                continue
            if verdict == STREAM and not complete:
                upto = block.args_upto(text)
                if upto > pos:
                    out.append(text[pos:upto])
                    pos = upto
                pending = True
                break
            if verdict == STREAM:
                self._recheck(block)
            out.append(text[pos:block.end])
            pos = block.end
        else:
            upto = len(text) if finished else scan(text[pos:]).content_end + pos
            if upto > pos:
                out.append(text[pos:upto])
                pos = upto
            pending = pos < len(text)
        self._pos, self._pending = pos, pending
        return "" if self._silenced else "".join(out)

    def _decide(self, block: ScannedBlock, complete: bool) -> str | None:
        if block.start in self._decided:
            return self._decided[block.start]
        policy = self.guard.policy_set
        assert policy is not None
        if block.name is not None and not args_decide(policy, self.key_id, block.name):
            verdict = self._judge(ToolCall(block.name, {}))
        elif complete:
            verdicts = [self._judge(ToolCall(c.name, c.arguments)) for c in block.calls()]
            verdict = DROP if DROP in verdicts else ALLOW
        else:
            return None
        self._decided[block.start] = STREAM if verdict == ALLOW and block.name is not None else verdict
        return self._decided[block.start]

    def _judge(self, call: ToolCall) -> str:
        """One call's verdict, counted: a refusal raises; "allow" or "drop" (held for approval)."""
        return self._verdict(call)[0]

    def _verdict(self, call: ToolCall) -> tuple[str, ToolCallVerdict]:
        policy, guard = self.guard.policy_set, self.guard
        assert policy is not None
        self._counted += 1
        before = guard.session(self.key_id).reserve(1)
        killed = self.killed or guard.kill_switch.is_killed(self.key_id)
        v: ToolCallVerdict = check_tool_call(policy, self.key_id, call, request_calls=self._counted,
                                             session_calls=before + 1, killed=killed)
        if v.outcome == "deny":
            raise GuardRefusal(refusal_message(call.name, v.decision.rule),
                               "tool-call", v.decision)
        if v.outcome == "requires_approval":
            if not self.held_for_approval:
                self.notes.append(GuardNote("tool-call", "requires_approval", v.decision))
            self.held_for_approval = True
            return DROP, v
        return ALLOW, v

    def _recheck(self, block: ScannedBlock) -> None:
        """A streamed block, once complete, must hold just the call judged by its name."""
        calls = block.calls()
        if [c.name for c in calls] == [block.name]:
            return
        for call in calls:
            outcome, v = self._verdict(ToolCall(call.name, call.arguments))
            if outcome != ALLOW:  # held for approval, but part of its block has left: refused instead
                raise GuardRefusal(refusal_message(call.name, v.decision.rule),
                                   "tool-call", v.decision)
