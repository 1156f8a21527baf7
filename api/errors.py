"""The control plane's one error tree: every exception class defined in api/ derives from
SealedApiError (tests/api/test_error_tree.py checks), beside the builtin it always was (ValueError,
RuntimeError: existing handlers keep catching it). The gateway's OpenAI-shaped errors are
protocol.openai.errors.OpenAIError's tree (api/gateway/errors.py).

At the HTTP edge (api/app.py) one that no route turned into an answer is opaque: a 500 naming
nothing but "internal error", logged with its type only (messages may name tenants, paths, keys)."""

from __future__ import annotations


class SealedApiError(Exception):
    """Root of the control plane's own errors."""
