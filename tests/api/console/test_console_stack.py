"""Against a real `sealed up` stack: a tenant admin revokes the tenant key in the browser, and the
worker drops out (it wipes the key and stops serving at its next key check; the gateway stops
routing to it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.management.auth import issue_token
from api.stack import DEMO_TENANT
from tests.api.conftest import RunningStack, start_sealed_up, stop_sealed_up
from tests.api.console.browser import connect_broker, launch_chromium, login

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    yield from launch_chromium()


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    # Its own stack: revoking the demo tenant's key would break every other test sharing one.
    running = start_sealed_up(tmp_path_factory.mktemp("console-stack"))
    yield running
    if running.proc.poll() is None:
        stop_sealed_up(running)


def _worker_state(page) -> str:  # type: ignore[no-untyped-def]
    return page.get_attribute(f"table.workers tr[data-tenant='{DEMO_TENANT}']", "data-status") or ""


def test_revoke_in_the_browser_and_the_worker_drops_out(browser, own_stack: RunningStack,
                                                       screenshot_dir: Path) -> None:
    secret = (own_stack.home / "gateway" / "jwt-secret").read_text().strip()
    page = login(browser, own_stack.url, issue_token(secret, "admin@demo", "tenant-admin", DEMO_TENANT))
    # The demo tenant's own broker token (on one machine the operator mints it; the gateway has none).
    operator = (own_stack.home / "broker" / "admin-token").read_text().strip()
    broker_url = json.loads((own_stack.home / "run" / "pids.json").read_text())["broker_url"]
    minted = httpx.post(f"{broker_url}/v1/admin/tenants/{DEMO_TENANT}/admin-tokens", timeout=30.0,
                        headers={"Authorization": f"Bearer {operator}"})
    assert minted.status_code == 201, minted.text
    connect_broker(page, own_stack.url, minted.json()["token"])
    page.goto(f"{own_stack.url}/console/workers")
    assert _worker_state(page) == "ready"
    row = page.inner_text(f"table.workers tr[data-tenant='{DEMO_TENANT}']")
    assert "SIMULATED" in row and "matches reference" in row and "signed by the key broker" in row
    page.screenshot(path=str(screenshot_dir / "workers-stack.png"))
    page.goto(f"{own_stack.url}/console/keys")
    assert page.locator(".receipts tbody tr.verified").count() >= 1  # the worker's release, verified
    page.click("a.button.danger")
    page.fill("input[name=confirm]", DEMO_TENANT)
    page.click("form button.danger")
    page.wait_for_url(f"{own_stack.url}/console/keys?tenant={DEMO_TENANT}&done=revoked")
    assert page.inner_text("#key-state") == "REVOKED"
    # The worker polls its key status (every 30 s by default): wait for it to drop out.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page.goto(f"{own_stack.url}/console/workers")
        if _worker_state(page) != "ready":
            break
        time.sleep(2)
    assert _worker_state(page) in ("failed", "unreachable")
    assert "not routed" in page.inner_text(f"table.workers tr[data-tenant='{DEMO_TENANT}']")
    page.screenshot(path=str(screenshot_dir / "workers-revoked.png"))
    answer = httpx.post(f"{own_stack.url}/v1/chat/completions", timeout=30.0,
                        headers={"Authorization": f"Bearer {own_stack.api_key}"},
                        json={"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 4})
    assert answer.status_code == 503
    page.goto(f"{own_stack.url}/console/audit?tenant={DEMO_TENANT}")
    timeline = page.inner_text("table.timeline")
    assert "tenant-key-revoke" in timeline and "release" in timeline
    page.context.close()
