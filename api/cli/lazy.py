"""A command group that imports a subcommand's module only when that subcommand runs.

`sealed attest verify` must start in well under a second: importing every subcommand up front would
load torch (through the engine) and SQLAlchemy (through the control-plane store) for every command.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    # The click that typer vendors (and passes to these overrides: a plain click Context, not
    # typer.Context); typer's TyperGroup signatures name these types.
    from typer._click import Command, Context, HelpFormatter


@dataclass(frozen=True)
class LazyCommand:
    """`target` is "module:attr": a function (one command) or a builder returning a `typer.Typer` (a group)."""

    target: str
    help: str
    context_settings: dict[str, Any] = field(default_factory=dict)
    is_group: bool = False
    # For a command whose module is a separate distribution (not the product's): what to install when
    # that module is absent, said in one line instead of a traceback.
    absent: str = ""


class LazyGroup(TyperGroup):
    """Subclasses set `commands_table`; commands are built from it on first use."""

    commands_table: dict[str, LazyCommand] = {}  # noqa: RUF012 - replaced per subclass, never mutated

    def list_commands(self, ctx: Context) -> list[str]:
        return sorted(self.commands_table)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        entry = self.commands_table.get(cmd_name)
        if entry is None:
            return None
        module_name, attr = entry.target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if not entry.absent or error.name != module_name.partition(".")[0]:
                raise
            typer.echo(f"sealed {cmd_name}: {entry.absent}", err=True)
            raise typer.Exit(2) from None
        obj = getattr(module, attr)
        holder = typer.Typer(add_completion=False)
        if entry.is_group:
            holder.add_typer(obj(), name=cmd_name)
            # With a sub-Typer added, get_command builds exactly get_group's TyperGroup.
            return typer.main.get_group(holder).commands[cmd_name]
        holder.command(cmd_name, context_settings=entry.context_settings)(obj)
        return typer.main.get_command(holder)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        # Plain help from the table: the rich help would build (so import) every subcommand.
        formatter.write_usage(ctx.command_path, "COMMAND [ARGS]...")
        formatter.write_paragraph()
        formatter.write_text(self.help or "")
        with formatter.section("Options"):
            formatter.write_dl([("--help", "Show this message and exit.")])
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.commands_table[name].help) for name in self.list_commands(ctx)])
