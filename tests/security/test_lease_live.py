"""#33 live: the tenant tightens its release policy and the running worker stops serving within its
lease; the gateway answers 503 for the model until a compliant worker is up again.

The fake-TEE stack of tests/security/test_operator_attacks.py (the worker attests as SEV-SNP through
the fake kernel interface; the real broker, gateway and worker as `sealed up` runs them). The
tenant signs, with its own policy-admin key, a release policy that no longer admits the worker's
measurement; the broker's next appraisal of the held lease renewal refuses it. That the worker
learned it from the broker (not from its lease running out) is read from its log, so nothing here
is timed: the loops below only guard against a hang.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx

from api.home import ed25519_key
from api.stack import DEMO_ADMIN_KEY_ID, DEMO_MODEL, DEMO_TENANT
from policy.release_documents import sign_release_policy
from sealed_fakes.platform import SNP_MEASUREMENT, TDX_MR_TD
from tests.api.test_fake_tee_stack import audit_records, chat
from tests.security import test_operator_attacks as attacks
from tests.security.test_operator_attacks import Live

live = attacks.live  # the live stack fixture (module scope: a stack of this module's own)


def _put_signed_policy(live: Live, measurements: list[str]) -> int:
    """The tenant signs the next version of its demo release policy; the operator's token carries it."""
    token = (live.env.home.broker / "admin-token").read_text().strip()
    url = f"{live.stack.broker_url}/v1/admin/tenants/{DEMO_TENANT}/policies"
    headers = {"Authorization": f"Bearer {token}"}
    current: dict[str, Any] = max((p for p in httpx.get(url, headers=headers, timeout=30).json()
                                   if p["model"] == DEMO_MODEL), key=lambda p: p["version"])
    doc = {**current, "version": current["version"] + 1, "allowed_measurements": measurements}
    admin = ed25519_key(live.env.home.tenant_policy_admin(DEMO_TENANT))
    answer = httpx.put(url, headers=headers, json=sign_release_policy(doc, admin, DEMO_ADMIN_KEY_ID), timeout=30)
    assert answer.status_code == 200, answer.text
    return int(doc["version"])


def _until(predicate: Any, guard_s: float, what: str) -> None:
    deadline = time.monotonic() + guard_s  # a hang guard, not a duration being tested
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.5)


def test_a_tightened_release_policy_stops_the_running_worker(live: Live) -> None:
    home, stack = live.env.home, live.stack
    assert chat(stack, live.env.api_key).status_code == 200
    seen = len(audit_records(home))
    _put_signed_policy(live, [TDX_MR_TD.hex()])  # the worker's SNP measurement is no longer allowed

    worker_log = home.logs / "worker.log"
    _until(lambda: "data key revoked by the key broker" in worker_log.read_text(), 120,
           "the broker told the worker its key is revoked")
    log = worker_log.read_text()
    assert "key lease expired" not in log  # told by the broker within the lease, not at its end
    denials = [r for r in audit_records(home)[seen:] if r["action"] == "lease" and r["decision"] == "deny"]
    assert denials and denials[0]["reason"].startswith("re-appraisal:"), denials

    # The worker wiped and says "failed": the gateway answers 503 for the model.
    _until(lambda: chat(stack, live.env.api_key, timeout=0).status_code == 503, 60, "the gateway answers 503")
    r = chat(stack, live.env.api_key, timeout=0)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable", r.text

    # The tenant admits the measurement again and a new worker process boots: it attests, gets the
    # key under the current policy, and the model is served again.
    _put_signed_policy(live, [SNP_MEASUREMENT.hex()])
    for proc in stack.workers:
        os.kill(proc.pid, signal.SIGTERM)  # the supervisor starts it again (same arguments)
    r = chat(stack, live.env.api_key, timeout=300)
    assert r.status_code == 200, r.text
