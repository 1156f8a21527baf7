"""`sealed bench encrypt`: `sealed encrypt`'s throughput and peak memory on a checkpoint of any size.

    sealed bench encrypt --model DIR [--out-dir DIR] --json out.json
    sealed bench encrypt --shape llama-3.2-1b --dtype bf16 [--layers N] --json out.json   (makes one first)

The encryption (the command's own path: `open_source` + `encrypt_checkpoint`, an unquantized HF
directory streamed from its shards) runs in a fresh process, which reports its wall time, its CPU
time (user + system, and system alone: the kernel's page cache and I/O work; on a shared machine,
bytes / CPU seconds is what one core sustains), the threads that encrypted, its
resident memory after the imports and its peak (VmHWM, mapped file pages included). Targets
(issue #49): >= 1 GB/s on one core, peak RSS under 1 GB whatever the model size. No assertions.
`--verify` decrypts the package afterwards (the whole model in memory: small models only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_PROBE = """
import json, resource, sys, time
from contextlib import ExitStack
from pathlib import Path
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from api.tenant_tools import encrypt_checkpoint, open_source
from enclave_worker.package.encrypt_segments import default_threads

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM:", "VmRSS:")):
            yield int(line.split()[1]) * 1024

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_stime

threads = int(sys.argv[3]) or default_threads()
baseline = list(hwm())[1]
wall, (c0, s0) = time.perf_counter(), cpu()
with ExitStack() as stack:
    checkpoint = open_source(Path(sys.argv[1]), stack)
    streamed = type(checkpoint).__name__
    result = encrypt_checkpoint(checkpoint, Path(sys.argv[2]), tenant="bench", model="m", version="v1",
                                signing_key=Ed25519PrivateKey.generate(), threads=threads)
wall, (c1, s1) = time.perf_counter() - wall, cpu()
print(json.dumps({"wall_s": wall, "cpu_s": c1 - c0, "sys_s": s1 - s0, "rss_after_imports": baseline,
                  "peak_rss": next(hwm()),
                  "plaintext_bytes": result.manifest.plaintext_bytes, "segments": result.manifest.num_segments,
                  "checkpoint": streamed, "threads": threads, "data_key": result.data_key.hex()}))
"""


def _machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench encrypt", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="an HF checkpoint directory to encrypt")
    parser.add_argument("--shape", default=None, help="no --model: make this shape first (make-model's shapes)")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--out-dir", type=Path, default=None, help="where the package (and a made model) go; "
                                                                   "default a temporary directory, removed")
    parser.add_argument("--threads", type=int, default=0, help="encrypting threads (default: one per core, "
                                                               "at most 4)")
    parser.add_argument("--verify", action="store_true", help="decrypt the package afterwards (small models)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if (args.model is None) == (args.shape is None):
        parser.error("give exactly one of --model DIR or --shape SHAPE")
    work = args.out_dir or Path(tempfile.mkdtemp(prefix="sealed-bench-encrypt-"))
    try:
        model = args.model
        if model is None:
            from sealed_bench.make_model import model_config, write_checkpoint

            model = write_checkpoint(work / "model", model_config(args.shape, args.dtype, args.layers)).out
        pkg = work / "package"
        shutil.rmtree(pkg, ignore_errors=True)
        load_before = os.getloadavg()
        proc = subprocess.run([sys.executable, "-c", _PROBE, str(model), str(pkg), str(args.threads)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        probe = json.loads(proc.stdout.strip().splitlines()[-1])
        data_key = bytes.fromhex(probe.pop("data_key"))
        gb = probe["plaintext_bytes"] / 1e9
        report: dict[str, Any] = {
            "model": str(model), "shape": args.shape, **probe,
            "throughput_gbps": round(gb / probe["wall_s"], 3), "cpu_throughput_gbps": round(gb / probe["cpu_s"], 3),
            # the process's own work (read, hash, encrypt), without the kernel's page cache and I/O work
            "user_throughput_gbps": round(gb / max(probe["cpu_s"] - probe["sys_s"], 1e-9), 3),
            "peak_rss_mib": round(probe["peak_rss"] / 2**20, 1), "out_dir": str(work),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "machine": _machine(),
            "commit": _commit(), "targets": {"throughput_gbps": 1.0, "peak_rss_bytes_below": 1 << 30},
        }
        if args.verify:
            from enclave_worker.package import decrypt_package

            decrypted = decrypt_package(pkg, data_key)
            report["verified_tensors"] = len(decrypted.tensors)
    finally:
        if args.out_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
