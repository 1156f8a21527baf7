"""`sealed bench NAME [ARGS...]`: run tests/benchmarks/bench_NAME.py from this checkout."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

BENCH_DIR = Path(__file__).resolve().parents[2] / "tests" / "benchmarks"


def bench(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="engine | attest | keyrelease | load | policy | serve"),
) -> None:
    """Run a benchmark; it writes JSON with --json FILE. Needs a source checkout."""
    script = BENCH_DIR / f"bench_{name}.py"
    if not script.exists():
        available = sorted(p.stem.removeprefix("bench_") for p in BENCH_DIR.glob("bench_*.py"))
        raise typer.BadParameter(f"unknown benchmark {name!r}; available: {', '.join(available) or 'none'}")
    spec = importlib.util.spec_from_file_location(f"sealed_bench_{name}", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raise typer.Exit(module.main(list(ctx.args)))
