"""`sealed usage` reads the control-plane database (per tenant and per key)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from api.cli.usage import usage
from api.home import Home
from api.store.db import make_engine, session_factory, sqlite_url, upgrade
from api.store.repo import Store
from tests.api.signed_usage import signed_row


def test_usage_per_tenant_and_key_from_the_local_database(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.create()
    engine = make_engine(sqlite_url(home.gateway))
    upgrade(engine)
    store = Store(session_factory(engine))
    store.ensure_tenant("acme")
    for i, key in enumerate(("k1", "k1", "k2")):  # distinct requests: each is metered once
        store.record_usage(signed_row(store, request_id=f"r{i}", tenant="acme", key_id=key, model="m", version="v1",
                                      worker_id="w", prompt_tokens=4, completion_tokens=6, worker_seconds=0.25))
    engine.dispose()
    app = typer.Typer()
    app.command()(usage)
    out = CliRunner().invoke(app, ["--home", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["key_id"]: r for r in json.loads(out.output)}
    assert rows["k1"]["requests"] == 2 and rows["k1"]["completion_tokens"] == 12 and rows["k2"]["requests"] == 1
    table = CliRunner().invoke(app, ["--home", str(tmp_path)])
    assert "(all keys)" in table.output and "acme" in table.output
