"""`sealed bench vllmload`: vLLM loading our encrypted package vs vLLM loading the same weights in plaintext.

Side by side in one run, each load in a fresh process of vLLM's virtualenv, alternating:
- sealed: decrypt the package into memory, then vLLM's engine build with our loader
  (`enclave_worker/vllm_engine/loader.py`) - what a vLLM worker does after key release;
- plain: vLLM's engine build from a plaintext safetensors directory with vLLM's own loader.

Both builds include everything else vLLM does at start (model construction, KV cache allocation,
warm-up), so the ratio is what a tenant pays for encryption at load. The plaintext directory is
the benchmark's reference only: written to a temporary directory and deleted at the end.
Both sides give vLLM the same CPU binding (peers.py: every CPU, none reserved, unless
`--vllm-cpu-bind` says otherwise); each run row records it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.vllm_cpu_binding import VllmCpuBinding, allowed_cpus
from sealed_bench.peers import vllm_binding, vllm_peer
from sealed_bench.processes import REPO, source_pythonpath
from sealed_bench.vllm_side import add_vllm_options, machine, vllm_interpreter


def _probe(python: str, mode: str, path: Path, binding: VllmCpuBinding, key_hex: str = "") -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": source_pythonpath(os.environ.get("PYTHONPATH", ""))}
    # The data key goes over a pipe from this process, never in argv (which other users can read).
    spec = json.dumps({"bind": binding.bind, "reserved": binding.reserved})
    proc = subprocess.run([python, "-m", "sealed_bench.vllm_load_probe", mode, str(path), spec], input=key_hex + "\n",
                          env=env, capture_output=True, text=True, timeout=1800, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} load failed: {proc.stderr[-2000:]}")
    timings: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])  # the probe's last line
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench vllmload", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF or HF dir (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=3, help="loads per side (alternating)")
    add_vllm_options(parser)
    args = parser.parse_args(argv)
    binding = vllm_binding(args, parser)
    config = vllm_peer(binding, allowed_cpus(), "float32").record()

    from safetensors.torch import save_file

    from api.tenant_tools import default_model_path, encrypt_checkpoint, load_source
    from enclave_worker.vllm_engine.runtime import architecture_config

    python = vllm_interpreter(args)
    root = Path(tempfile.mkdtemp(prefix="sealed-bench-vllmload-"))
    try:
        checkpoint = load_source(args.model or default_model_path())
        encrypted = encrypt_checkpoint(checkpoint, root / "pkg", tenant="bench", model="m", version="1",
                                       signing_key=Ed25519PrivateKey.generate())
        plain_dir = root / "plain"
        plain_dir.mkdir()
        save_file({k: v.contiguous() for k, v in checkpoint.tensors.items()}, str(plain_dir / "model.safetensors"))
        (plain_dir / "config.json").write_text(json.dumps(architecture_config(checkpoint.config)))
        weight_bytes = sum(t.nbytes for t in checkpoint.tensors.values())
        del checkpoint
        runs: dict[str, list[dict]] = {"sealed": [], "plain": []}
        for i in range(args.repeats):
            order = ("sealed", "plain") if i % 2 == 0 else ("plain", "sealed")
            for mode in order:
                path = root / "pkg" if mode == "sealed" else plain_dir
                timings = _probe(python, mode, path, binding, encrypted.data_key.hex() if mode == "sealed" else "")
                runs[mode].append({**timings, "config": config})
                print(mode, json.dumps({k: round(v, 3) for k, v in timings.items()}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "config"} for mode, rs in runs.items()}
    ratio = med["sealed"]["total_s"] / med["plain"]["total_s"]
    result = {
        "benchmark": "vllmload", "weight_bytes": weight_bytes, "repeats": args.repeats, "runs": runs,
        "median": med, "ratio_sealed_to_plain": round(ratio, 3), "target": 1.2, "met": ratio <= 1.2,
        "config": config, "machine": machine(),
    }
    print(f"sealed (decrypt + vLLM build) {med['sealed']['total_s']:.2f} s "
          f"(decrypt {med['sealed']['decrypt_s']:.2f} s), plain safetensors {med['plain']['total_s']:.2f} s: "
          f"{ratio:.2f}x (target <= 1.2x)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0
