"""The stack under test, from the environment tests/api/test_frameworks.py sets; clients plaintext or
sealed (sealed_client.SealedOpenAI, verified against the stack's client policy)."""

from __future__ import annotations

import os
from typing import Any

MODES = ("plain", "sealed")


def stack() -> tuple[str, str, str]:
    """(base URL of /v1, API key, model)."""
    return (os.environ["SEALED_TEST_URL"] + "/v1", os.environ["SEALED_TEST_API_KEY"],
            os.environ.get("SEALED_TEST_MODEL", "smollm2-135m-instruct"))


def openai_clients(mode: str) -> tuple[Any, Any]:
    """(sync, async) official-SDK clients; `sealed`: SealedOpenAI, every request sealed to the worker."""
    import openai

    url, key, _ = stack()
    kw: dict[str, Any] = {"base_url": url, "api_key": key, "max_retries": 0, "timeout": 600.0}
    if mode == "plain":
        return openai.OpenAI(**kw), openai.AsyncOpenAI(**kw)
    from sealed_client import AsyncSealedOpenAI, SealedOpenAI

    policy = os.environ["SEALED_TEST_CLIENT_POLICY"]  # a file written from the stack's own home
    return SealedOpenAI(policy=policy, **kw), AsyncSealedOpenAI(policy=policy, **kw)
