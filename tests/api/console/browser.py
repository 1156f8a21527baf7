"""Playwright driving Debian's Chromium (`apt-get install chromium`; no browser download)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("SEALED_CHROMIUM", "/usr/bin/chromium"))
VIEWPORT = {"width": 1280, "height": 800}


def launch_chromium() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def login(browser, url: str, token: str):  # type: ignore[no-untyped-def]
    """A fresh browser context logged in with ``token`` (the page is on the audit timeline)."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{url}/console/login")
    page.fill("textarea[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/console/audit")
    return page


def connect_broker(page, url: str, token: str) -> None:  # type: ignore[no-untyped-def]
    """Give the console the person's own key-broker token on the Keys page (it holds none itself)."""
    page.goto(f"{url}/console/keys")
    page.fill("form.broker-connect input[name=token]", token)
    page.click("form.broker-connect button[type=submit]")
    page.wait_for_url(f"{url}/console/keys")
