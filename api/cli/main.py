"""`sealed`: the command line of the service (typer)."""

from __future__ import annotations

import typer

from api.cli import attest, audit, bench, encrypt, keys, sealed_cmds, up, upload, usage


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False,
                      help="Sealed: confidential-compute private model hosting.")
    app.command("up")(up.up)
    app.command("encrypt")(encrypt.encrypt)
    app.command("upload")(upload.upload)
    app.command("usage")(usage.usage)
    app.command("verify")(sealed_cmds.verify)
    app.command("proxy")(sealed_cmds.proxy)
    app.add_typer(attest.build(), name="attest")
    app.add_typer(audit.build(), name="audit")
    app.add_typer(keys.build(), name="keys")
    app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench.bench)
    return app


def main() -> None:
    build()()


if __name__ == "__main__":
    main()
