"""A command whose module is another distribution (`sealed bench`: the development packages in
devtools/, not the product's wheel) says in one line what to install when that module is absent,
instead of a traceback; a missing import inside a present module is not hidden by it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from api.cli.lazy import LazyCommand, LazyGroup
from api.cli.main import COMMANDS

HINT = "install the absent package"


class Group(LazyGroup):
    commands_table = {  # noqa: RUF012 - a test table
        "absent": LazyCommand("sealed_no_such_distribution.cli:run", "a command from a package not installed",
                              absent=HINT),
        "broken": LazyCommand("broken_inside.cli:run", "a present package whose own import fails", absent=HINT),
    }


def _app() -> typer.Typer:
    app = typer.Typer(cls=Group, add_completion=False)

    @app.callback()
    def root() -> None:
        """Test group."""

    return app


def test_an_absent_package_is_one_line_naming_what_to_install() -> None:
    result = CliRunner().invoke(_app(), ["absent"])
    assert result.exit_code == 2
    assert result.output.strip() == f"sealed absent: {HINT}"
    assert "Traceback" not in result.output


def test_a_missing_import_inside_a_present_package_is_not_masked(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "broken_inside"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text("import sealed_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(_app(), ["broken"])
    finally:
        for name in ("broken_inside", "broken_inside.cli"):
            sys.modules.pop(name, None)
    assert isinstance(result.exception, ModuleNotFoundError)
    assert result.exception.name == "sealed_no_such_dependency"


def test_sealed_bench_names_the_development_package() -> None:
    assert "devtools" in COMMANDS["bench"].absent and "make install" in COMMANDS["bench"].absent
