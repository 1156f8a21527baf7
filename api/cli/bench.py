"""`sealed bench NAME [ARGS...]`: run a benchmark from the shipped `sealed_bench` package."""

from __future__ import annotations

import typer


def bench(
    ctx: typer.Context,
    name: str = typer.Argument("", show_default=False, help="the benchmark; `sealed bench` alone lists them"),
) -> None:
    """Run a benchmark (each writes JSON with --json FILE); `sealed bench NAME --help` shows its options."""
    import sealed_bench  # a benchmark's imports (torch, a stack) load only when one runs

    if not name or name in ("-h", "--help"):
        typer.echo("usage: sealed bench NAME [ARGS...]   (sealed bench NAME --help for its options)")
        typer.echo("benchmarks: " + ", ".join(sealed_bench.available()))
        raise typer.Exit(0)
    try:
        run = sealed_bench.load(name)
    except sealed_bench.UnknownBenchmarkError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from exc
    raise typer.Exit(run(list(ctx.args)))
