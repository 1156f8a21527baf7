"""#33 (gateway side): a worker whose lease ended stops answering, reports "failed" in its heartbeat,
and the gateway answers 503 (model_unavailable, retryable) for that model until a compliant worker
is ready; then it routes to that one.

The in-process gateway and the workers' real gRPC servers (tests/security/harness.py): the first
worker is the real servicer whose lease runs on an injected clock; the second a stand-in servicer
that is still attesting ("starting") until the test says it passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from enclave_worker.keywatch import KeyLease, LeaseTiming
from enclave_worker.servicer import WorkerServicer
from protocol.model_ref import ModelRef
from tests.api.fake_worker import FakeServicer
from tests.security.harness import InProcess, gateway
from tests.security.test_keywatch import FakeBooted, released
from tests.security.test_lease_wipe import FakeClock


@dataclass
class LeasedBooted(FakeBooted):
    """A booted worker as the heartbeat reads it (the released key, the model digest)."""

    released: Any = field(default_factory=released)
    model_digest: str = "00" * 32
    gpu_cc_off: bool = False
    load_s: float = 0.0


BODY = {"model": "m", "prompt": "hello", "max_tokens": 2}


async def complete(gw: InProcess) -> httpx.Response:
    return await gw.client.post("/v1/completions", headers=gw.headers(), json=BODY)


async def test_the_gateway_answers_503_until_a_compliant_worker_is_ready(tmp_path: Path) -> None:
    async with gateway(tmp_path, [WorkerServicer, lambda state: FakeServicer(state, 0.0)]) as gw:
        leased, replacement = gw.states
        clock = FakeClock()
        booted = LeasedBooted()
        booted.engine.stats = dict  # type: ignore[attr-defined]  # what the heartbeat reports of it
        leased.live.booted = booted  # type: ignore[assignment]
        leased.live.lease = KeyLease("http://broker", released(), leased.identity(), ModelRef("acme", "m", "v1"),
                                     LeaseTiming(lease_s=60.0), clock=clock.monotonic)
        replacement.live.status = "starting"  # attesting: not routable yet
        await gw.beat()
        assert [w.worker_id for w in gw.service.registry.ready("acme", "m")] == [gw.workers[0]]

        # The lease runs out (no renewal): the worker refuses the next request itself, typed, and wipes.
        clock.advance(61.0)
        r = await complete(gw)
        assert r.status_code == 503 and r.json()["error"]["message"], r.text
        assert booted.wiped and leased.live.status == "failed"

        # Its next heartbeat says "failed": the gateway stops routing to it and answers 503 itself.
        await gw.beat()
        assert gw.service.registry.ready("acme", "m") == []
        for _ in range(2):
            r = await complete(gw)
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "model_unavailable" and r.headers["retry-after"]
            # The states of the model's live workers follow (the replacement is still "starting").
            assert error["message"].startswith("model unavailable: no attested worker is serving it")

        # A compliant worker (it attested and got the key) is ready: the model is served again.
        replacement.live.status = "ready"
        await gw.beat()
        r = await complete(gw)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].startswith("v1")
        assert leased.live.status == "failed"  # the wiped worker stays out
