"""Agent controls: tool allowlists, argument constraints, call caps, approvals, kill switch."""

from policy.agents.tools import (
    KillSwitch,
    SessionState,
    ToolCall,
    ToolCallVerdict,
    ToolCallVerdicts,
    args_decide,
    check_tool_call,
    check_tool_calls,
    refusal_message,
)
from policy.agents.urls import UrlRejected, check_url, normalize_host

__all__ = [
    "KillSwitch", "SessionState", "ToolCall", "ToolCallVerdict", "ToolCallVerdicts", "UrlRejected",
    "args_decide", "check_tool_call", "check_tool_calls", "check_url", "normalize_host",
    "refusal_message",
]
