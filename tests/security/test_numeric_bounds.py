"""#13 finding 9: numbers beyond the worker protocol's types (max_tokens, seed beyond 2^63) were a 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.fake_worker import FakeServicer
from tests.security.harness import gateway

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("route,extra", [
    ("/v1/chat/completions", {"max_tokens": 1 << 64}),
    ("/v1/chat/completions", {"max_tokens": 1 << 32}),
    ("/v1/chat/completions", {"max_completion_tokens": 1 << 63}),
    ("/v1/chat/completions", {"seed": 1 << 63, "max_tokens": 1}),
    ("/v1/chat/completions", {"seed": -(1 << 63) - 1, "max_tokens": 1}),
    ("/v1/completions", {"seed": 1 << 70, "max_tokens": 1}),
    ("/v1/completions", {"max_tokens": 1 << 63}),
    ("/v1/chat/completions", {"top_logprobs": 1 << 63, "logprobs": True}),
    ("/v1/chat/completions", {"n": 1 << 63}),
    ("/v1/chat/completions", {"priority": 1 << 63}),
])
async def test_out_of_range_numbers_are_400(tmp_path: Path, route: str, extra: dict) -> None:
    async with gateway(tmp_path, [lambda s: FakeServicer(s, 0.001)]) as gw:
        base = CHAT if "chat" in route else {"model": "m", "prompt": "x"}
        r = await gw.client.post(route, headers=gw.headers(), json={**base, **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


async def test_the_largest_seed_still_works_with_n(tmp_path: Path) -> None:
    async with gateway(tmp_path, [lambda s: FakeServicer(s, 0.001)]) as gw:
        r = await gw.client.post("/v1/chat/completions", headers=gw.headers(),
                                 json={**CHAT, "seed": (1 << 63) - 1, "n": 3, "max_tokens": 1})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("body", [{"name": "t", "rpm": 1 << 64}, {"name": "t", "token_budget": 1 << 63},
                                  {"name": "t", "tpm": 1 << 63}])
async def test_management_numbers_beyond_64_bits_are_400(tmp_path: Path, body: dict) -> None:
    from tests.security.test_public_surface import _jwt

    async with gateway(tmp_path, []) as gw:
        r = await gw.client.post("/admin/v1/tenants/acme/keys", headers=_jwt("operator"), json=body)
        assert r.status_code == 400, r.text
