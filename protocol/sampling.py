"""Sampling limits every hop agrees on. A request that names no max_tokens gets DEFAULT_MAX_TOKENS,
whichever endpoint it came through (chat or completions), and the worker and the engine fall back
to the same number; the gateway's `default_max_tokens` setting starts from it."""

DEFAULT_MAX_TOKENS = 256
