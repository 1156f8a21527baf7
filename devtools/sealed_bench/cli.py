"""`sealed bench NAME [ARGS...]`: run a benchmark from this package.

The command lives here, not in `api/cli/`: the benchmarks import the control plane, so the control
plane may not import them (pyproject's import contracts). `sealed`'s command table names this
function by string, as it names every command; the CLI entry point is the one place that knows
both packages."""

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
