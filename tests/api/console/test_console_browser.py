"""The console in a real browser: log in per role, scope, filters, exports, revoke, a tampered
log, and a screenshot of every page (test-artifacts/screenshots/, 1280x800)."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.console.auditindex import load_component_keys
from policy.audit import verify_log
from policy.errors import AuditIntegrityError
from tests.api.console.browser import connect_broker, launch_chromium, login
from tests.api.console.site import TENANTS, Site

PAGES = ("audit", "workers", "keys", "usage", "policies")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    yield from launch_chromium()


def _tenants_in_timeline(page) -> set[str]:  # type: ignore[no-untyped-def]
    return set(page.eval_on_selector_all("table.timeline tbody tr[data-tenant]",
                                         "rows => rows.map(r => r.dataset.tenant)"))


@pytest.mark.parametrize(("role", "tenant"), [("auditor", None), ("operator", None), ("tenant-admin", "acme")])
def test_login_per_role_sees_its_scope_and_every_page_renders(browser, site: Site, screenshot_dir: Path,
                                                              role: str, tenant: str | None) -> None:
    page = login(browser, site.url, site.token(role, tenant))
    assert page.inner_text(".whoami").startswith(f"{role}@test · {role}")
    seen = _tenants_in_timeline(page)
    # Operators and auditors also see refusals no tenant can be named for ("-": an unknown key, a
    # path that does not exist, the browser's own favicon request); a tenant admin sees only its own.
    if tenant:
        assert seen == {tenant}
    else:
        assert seen - {"-"} == set(TENANTS)
    for name in PAGES:
        page.goto(f"{site.url}/console/{name}")
        assert page.locator("h1").first.is_visible()
        page.screenshot(path=str(screenshot_dir / f"{name}-{role}.png"))
        text = page.content()
        if tenant:
            assert all(other not in text for other in TENANTS if other != tenant), name
    # The revoke action is offered to tenant admins and operators, never to the auditor, and only
    # once the person gave the console its own broker token (the console holds none).
    page.goto(f"{site.url}/console/keys")
    assert page.locator("a.button.danger").count() == 0
    token = site.broker_token(role, tenant)
    if token is not None:
        connect_broker(page, site.url, token)
    page.goto(f"{site.url}/console/keys")
    assert page.locator("a.button.danger").count() == (0 if role == "auditor" else 1)
    page.context.close()


def test_filter_the_audit_timeline(browser, site: Site) -> None:
    page = login(browser, site.url, site.token("auditor"))
    page.select_option("select[name=tenant]", "globex")
    page.select_option("select[name=component]", "gateway")
    page.select_option("select[name=decision]", "deny")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r".*tenant=globex.*"))
    rows = page.locator("table.timeline tbody tr[data-tenant]")
    assert rows.count() == 2
    assert _tenants_in_timeline(page) == {"globex"}
    assert set(page.eval_on_selector_all("table.timeline tbody tr td.decision", "c => c.map(x => x.textContent)")) \
        == {"deny"}
    page.select_option("select[name=rule]", "admission.rate_limit")
    page.click("form.filters button[type=submit]")
    assert page.locator("table.timeline tbody tr[data-tenant]").count() == 2
    page.fill("input[name=since]", "2001-01-01T00:00")
    page.fill("input[name=until]", "2001-01-02T00:00")
    page.click("form.filters button[type=submit]")
    assert page.locator("table.timeline tbody tr[data-tenant]").count() == 0
    page.context.close()


def test_export_each_format_from_the_page(browser, site: Site, tmp_path: Path) -> None:
    page = login(browser, site.url, site.token("tenant-admin", "globex"))
    files = {}
    for label, fmt in (("JSON Lines", "jsonl"), ("CSV", "csv"), ("OCSF", "ocsf")):
        with page.expect_download() as info:
            page.click(f"p.exports a:has-text('{label}')")
        path = tmp_path / info.value.suggested_filename
        info.value.save_as(path)
        files[fmt] = path.read_text()
    entries = [json.loads(line) for line in files["jsonl"].splitlines()]
    assert entries and {e["tenant"] for e in entries} == {"globex"}
    rows = list(csv.DictReader(files["csv"].splitlines()))
    assert [r["hash"] for r in rows] == [e["hash"] for e in entries]
    events = [json.loads(line) for line in files["ocsf"].splitlines()]
    assert [e["metadata"]["uid"] for e in events] == [e["hash"] for e in entries]
    assert {e["class_uid"] for e in events} == {6003}
    for text in files.values():
        assert "acme" not in text and all(s not in text for s in site.secrets())
    page.context.close()


def test_tampered_byte_shows_the_break_at_that_entry(browser, site: Site, screenshot_dir: Path) -> None:
    log = site.audit_dir / "gateway.audit.jsonl"
    original = log.read_bytes()
    lines = original.split(b"\n")
    target = 7
    line = bytearray(lines[target])
    at = line.index(b'"reason":"') + len(b'"reason":"')
    line[at] ^= 0x01  # one byte of the reason: "admitted" becomes "`dmitted"
    tampered = b"\n".join([*lines[:target], bytes(line), *lines[target + 1:]])
    assert len(tampered) == len(original) and sum(a != b for a, b in zip(tampered, original, strict=True)) == 1
    log.write_bytes(tampered)
    try:
        with pytest.raises(AuditIntegrityError) as err:
            verify_log(log, load_component_keys(site.audit_dir / "keys"))
        assert err.value.index == target
        page = login(browser, site.url, site.token("auditor"))
        banner = page.locator(".chain-broken[data-log='gateway.audit.jsonl']")
        assert banner.is_visible()
        assert banner.get_attribute("data-break-index") == str(target)
        assert f"at entry #{target}" in banner.inner_text() and "entry hash mismatch" in banner.inner_text()
        color = banner.evaluate("e => getComputedStyle(e).color")
        assert color == "rgb(176, 0, 32)"  # red
        page.screenshot(path=str(screenshot_dir / "audit-chain-broken.png"))
        page.click(".chain-broken[data-log='gateway.audit.jsonl'] a")
        row = page.locator(f"tr#e-gateway\\.audit\\.jsonl-{target}")
        assert "broken" in (row.get_attribute("class") or "")
        assert "chain breaks here" in row.inner_text()
        page.screenshot(path=str(screenshot_dir / "audit-tampered.png"))
        # The other logs still verify.
        assert page.locator(".chain-ok[data-log='key-broker.audit.jsonl']").is_visible()
        page.context.close()
    finally:
        log.write_bytes(original)


def test_revoke_a_tenant_key_with_confirmation(browser, site: Site, screenshot_dir: Path) -> None:
    page = login(browser, site.url, site.token("tenant-admin", "globex", subject="alice@globex"))
    connect_broker(page, site.url, site.broker.tenant_token("globex"))  # alice's own broker token
    page.goto(f"{site.url}/console/keys")
    assert page.inner_text("#key-state") == "active"
    page.click("a.button.danger")
    page.fill("input[name=confirm]", "globe")  # a typo does not revoke
    page.click("form button.danger")
    assert "type the tenant's name exactly" in page.content()
    assert site.broker.admin("GET", "/tenants/globex").json()["revoked"] is False
    page.screenshot(path=str(screenshot_dir / "revoke-confirm.png"))
    page.fill("input[name=confirm]", "globex")
    page.click("form button.danger")
    page.wait_for_url(re.compile(r".*/console/keys\?tenant=globex&done=revoked"))
    assert page.inner_text("#key-state") == "REVOKED"
    assert site.broker.admin("GET", "/tenants/globex").json()["revoked"] is True
    assert site.broker.admin("GET", "/tenants/acme").json()["revoked"] is False
    # Audited: the broker's entry for the revocation is on the page's history and in the log.
    assert "tenant-key-revoke" in page.inner_text("body")
    page.goto(f"{site.url}/console/audit?rule=admin&tenant=globex")
    assert "tenant-key-revoke" in page.inner_text("table.timeline")
    # The console's own signed entry names the person; the broker's names only her broker token.
    page.goto(f"{site.url}/console/audit?component=console")
    row = page.locator("table.timeline tbody tr[data-tenant='globex']")
    assert row.count() == 1 and "actor=alice@globex" in row.inner_text() and "tenant-key-revoke" in row.inner_text()
    assert page.locator(".chain-ok[data-log='console.audit.jsonl']").is_visible()
    page.context.close()
