"""Sampling limits the hops agree on. A chat request that names no max_tokens gets the gateway's
`default_max_tokens`, which starts from DEFAULT_MAX_TOKENS (sealed mode uses it as is), and the
worker and the engine fall back to the same number. Legacy completions keep OpenAI's 16
(protocol/openai/completions.py)."""

DEFAULT_MAX_TOKENS = 256
