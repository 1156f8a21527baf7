"""`sealed`: the command line of the service (typer). Subcommands load lazily (api/cli/lazy.py)."""

from __future__ import annotations

import typer

from api.cli.lazy import LazyCommand, LazyGroup

# To add a command: one row here; its module is imported only when the command runs. `bench` is
# the benchmarks' own module, in the development distribution (devtools/, not the product's wheel):
# they import the control plane, so it cannot import them.
COMMANDS: dict[str, LazyCommand] = {
    "up": LazyCommand("api.cli.up:up", "Run key broker, worker and gateway on this machine."),
    "encrypt": LazyCommand("api.cli.encrypt:encrypt", "Encrypt a model into a signed package (tenant side)."),
    "upload": LazyCommand("api.cli.upload:upload", "Upload an encrypted package to the gateway."),
    "usage": LazyCommand("api.cli.usage:usage", "Show signed usage records."),
    "verify": LazyCommand("api.cli.sealed_cmds:verify", "Verify a deployment as a sealed-mode client would."),
    "proxy": LazyCommand("api.cli.sealed_cmds:proxy", "Local OpenAI endpoint that seals every request."),
    "attest": LazyCommand("api.cli.attest:build", "Verify or inspect TEE evidence offline.", is_group=True),
    "audit": LazyCommand("api.cli.audit:build", "Verify or export the audit log.", is_group=True),
    "keys": LazyCommand("api.cli.keys:build", "Tenant keys, release policies and receipts at the broker.",
                        is_group=True),
    "login": LazyCommand("api.cli.manage:login", "Store a management token (0600) for the commands below."),
    "tokens": LazyCommand("api.cli.manage:build_tokens", "Mint management tokens (operator).", is_group=True),
    "tenants": LazyCommand("api.cli.manage:build_tenants", "Create and list tenants.", is_group=True),
    "apikeys": LazyCommand("api.cli.manage:build_apikeys", "API keys for the gateway: scopes, limits, budgets.",
                           is_group=True),
    "models": LazyCommand("api.cli.models:build", "Model versions: register, promote, roll back, retire.",
                          is_group=True),
    "policies": LazyCommand("api.cli.manage:build_policies", "Tenant policies: in-enclave and key release.",
                            is_group=True),
    "measure": LazyCommand("api.cli.measure:build", "Compute launch measurements (reference values) offline.",
                           is_group=True),
    "tune": LazyCommand("api.cli.tune:tune", "Measure the engine's CPU options here; write an engine tuning file."),
    "bench": LazyCommand("sealed_bench.cli:bench", "Run a benchmark (sealed bench NAME --help; development installs).",
                         context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                           "help_option_names": []},
                         absent="the benchmarks are not part of the product and are not installed here; from a "
                                "checkout, `pip install --no-deps -e devtools` (`make install` does it)"),
}


class SealedGroup(LazyGroup):
    commands_table = COMMANDS


def build() -> typer.Typer:
    app = typer.Typer(cls=SealedGroup, no_args_is_help=True, add_completion=False,
                      help="Sealed: confidential-compute private model hosting.")

    @app.callback()
    def root() -> None:
        """Sealed: confidential-compute private model hosting."""

    return app


def main() -> None:
    build()(prog_name="sealed")


if __name__ == "__main__":
    main()
