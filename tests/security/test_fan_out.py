"""#13 finding 3: fan-out amplification on /v1/completions (prompts x n) and TPM charged in full."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.fake_worker import FakeServicer
from tests.security.harness import gateway


def fast(state):  # type: ignore[no-untyped-def]
    return FakeServicer(state, 0.001)


@pytest.mark.parametrize("prompts,n", [(100_000, 16), (65, 1), (8, 16), (1, 65)])
async def test_prompts_times_n_beyond_the_bound_is_400(tmp_path: Path, prompts: int, n: int) -> None:
    async with gateway(tmp_path, [fast]) as gw:
        r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                 json={"model": "m", "prompt": ["a"] * prompts, "n": n, "max_tokens": 1})
        assert r.status_code == 400, r.text
        assert gw.service.admission.running == 0


async def test_the_bound_itself_is_served(tmp_path: Path) -> None:
    async with gateway(tmp_path, [fast]) as gw:
        r = await gw.client.post("/v1/completions", headers=gw.headers(),
                                 json={"model": "m", "prompt": ["a"] * 16, "n": 4, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 64


async def test_a_request_larger_than_the_keys_tpm_is_refused_and_spends_nothing(tmp_path: Path) -> None:
    async with gateway(tmp_path, [fast]) as gw:
        secret, _ = gw.service.store.create_key("acme", "small", tpm=10)
        # The finding: 16 prompts x n=4 with max_tokens=1 spent 64 tokens of a 10-token-per-minute key.
        r = await gw.client.post("/v1/completions", headers=gw.headers(secret),
                                 json={"model": "m", "prompt": ["a"] * 16, "n": 4, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large", r.text
        r = await gw.client.post("/v1/chat/completions", headers=gw.headers(secret),
                                 json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 16,
                                       "max_tokens": 1})
        assert r.status_code == 400, r.text
        usage = gw.service.store.usage_summary("acme")
        assert sum(row["completion_tokens"] for row in usage) == 0


async def test_tpm_is_charged_for_the_whole_reservation(tmp_path: Path) -> None:
    async with gateway(tmp_path, [lambda state: FakeServicer(state, 0.5)]) as gw:
        secret, _ = gw.service.store.create_key("acme", "tpm", tpm=40)
        body = {"model": "m", "prompt": ["a"] * 4, "n": 4, "max_tokens": 2, "stream": True}  # reserves 33
        async with gw.client.stream("POST", "/v1/completions", headers=gw.headers(secret), json=body) as first:
            assert first.status_code == 200
            # While the first holds its reservation, a second one does not fit in what is left.
            second = await gw.client.post("/v1/completions", headers=gw.headers(secret), json=body)
            assert second.status_code == 429, second.text
            async for _ in first.aiter_lines():
                pass
