"""A worker started with `--stream-package` (enclave_worker/package/stream.py: the package authenticated
whole, then decrypted tensor by tensor as the build takes them) boots through the whole stack, gets its
key, and answers as the default worker does."""

from __future__ import annotations

from typing import Any as RunningStack  # the `stack` fixture's type lives in conftest.py

import openai
import pytest

from api.home import Home
from api.stack import DEMO_MODEL, free_port, launch
from tests.api.conftest import copy_home

PROMPT = [{"role": "user", "content": "Name three primary colours."}]


def _answer(url: str, api_key: str) -> str | None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=120)
    return client.chat.completions.create(model=DEMO_MODEL, messages=PROMPT, temperature=0,  # type: ignore[arg-type]
                                          max_tokens=16).choices[0].message.content


def test_a_streamed_package_boots_and_answers_as_the_whole_one(stack: RunningStack,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("streamed")
    copy_home(stack.home, root)
    home = Home(root)
    home.create()
    running = launch(home, port=free_port(), worker_extra_args=("--stream-package",))
    try:
        assert running.wait_ready(timeout=180) == "ready", (home.logs / "worker.log").read_text()[-2000:]
        key = (home.root / "demo" / "api-key").read_text().strip()
        streamed = _answer(running.gateway_url, key)
    finally:
        running.stop()
    assert streamed and streamed == _answer(stack.url, stack.api_key)
