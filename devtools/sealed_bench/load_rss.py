"""Peak RSS over a model's load into the engine, by phase: checkpoint read, engine build, first request.

Run: ``python devtools/sealed_bench/load_rss.py --model model-Q8_0.gguf --dtype int8 [--json out.json]``
(a GGUF file, its quantized linears and embedding kept native; or an HF directory, quantized at load).

A thread samples ``/proc/self/status`` (VmRSS, RssAnon, RssFile) every 20 ms; each phase reports its
highest sample, the kernel's own high-water mark (VmHWM) at its end and the RSS it leaves. Against
them: the weights as held (memory.held_bytes over the model's tensors) and the KV pool's bytes, which
issue 49 bounds the peak by (<= 1.15x their sum). One process per run: VmHWM never goes down.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

_FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status() -> dict[str, int]:
    """This process's memory fields from /proc/self/status, in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in _FIELDS:
                out[key] = int(line.split()[1]) * 1024
    return out


class Timeline:
    """RSS samples tagged with the phase running when they were taken."""

    def __init__(self, period_s: float = 0.02) -> None:
        self.phase = "start"
        self.samples: list[tuple[float, str, dict[str, int]]] = []
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()
        self.ends: dict[str, dict[str, Any]] = {}

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self._t0, self.phase, status()))
            self._stop.wait(period_s)

    def mark(self, phase: str) -> None:
        """The phase that ran until now ends here; ``phase`` begins."""
        self.samples.append((time.perf_counter() - self._t0, self.phase, status()))
        self.ends[self.phase] = {"t_s": round(time.perf_counter() - self._t0, 2), **status()}
        self.phase = phase

    def report(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join()
        rows = []
        for phase, end in self.ends.items():
            mine = [s for _, p, s in self.samples if p == phase]
            peak = max(mine, key=lambda s: s["VmRSS"]) if mine else end
            rows.append(
                {
                    "phase": phase,
                    "end_s": end["t_s"],
                    "peak_rss_mb": _mb(peak["VmRSS"]),
                    "peak_anon_mb": _mb(peak["RssAnon"]),
                    "peak_file_mb": _mb(peak["RssFile"]),
                    "hwm_at_end_mb": _mb(end["VmHWM"]),
                    "rss_at_end_mb": _mb(end["VmRSS"]),
                }
            )
        return rows


def _mb(n: int) -> float:
    return round(n / 1e6, 1)


def _package(path: Path, key: bytes, stream: bool) -> tuple[Any, Any]:
    """(DecryptedModel, Checkpoint) of an encrypted package, as enclave_worker/boot.py builds them;
    ``stream``: decrypted tensor by tensor as the build takes them (package/stream.py)."""
    from enclave_worker.engine.checkpoint import Checkpoint
    from enclave_worker.package import decrypt_package

    model = decrypt_package(path, key, stream=stream)
    meta = model.metadata
    ckpt = Checkpoint(
        config=meta["config"],
        tensors=model.tensors,
        tokenizer_json=meta["tokenizer_json"],
        chat_template=meta.get("chat_template"),
        release=model.release,
    )
    return model, ckpt


def run(args: argparse.Namespace) -> dict[str, Any]:
    timeline = Timeline()
    import torch

    from enclave_worker.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams
    from enclave_worker.engine.checkpoint import load_gguf, load_hf_dir
    from enclave_worker.engine.memory import held_bytes
    from enclave_worker.engine.models import model_tensors

    timeline.mark("read checkpoint")
    path = Path(args.model)
    if args.key_file:  # an encrypted package, loaded as the worker's boot does
        decrypted, ckpt = _package(path, bytes.fromhex(Path(args.key_file).read_text().strip()), args.stream)
    else:
        decrypted = None
        ckpt = load_gguf(path, native=True) if path.is_file() else load_hf_dir(path, stream=args.stream)
    timeline.mark("build engine")
    config = EngineConfig(
        dtype=args.dtype,
        kv_cache_memory_bytes=args.kv_mib << 20,
        max_num_seqs=1,
        max_num_batched_tokens=256,
        max_model_len=1024,
    )
    engine = LLMEngine.from_checkpoint(ckpt, config)
    del ckpt
    if decrypted is not None:
        decrypted.end_stream()
        decrypted.wipe()  # int8 at load: the engine holds none of the buffer (boot._release_unaliased)
        del decrypted
    timeline.mark("first request")
    out: list[int] = []
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)

    def sink(o: RequestOutput | BaseException) -> None:
        out.extend(o.delta_token_ids if isinstance(o, RequestOutput) else ())

    engine.add_request("r", list(range(1, 33)), params, sink)
    while engine.has_unfinished_requests():
        engine.step()
    timeline.mark("end")
    kv_cache = engine.runner.kv_cache
    kv = kv_cache.numel() * kv_cache.element_size()
    pool = kv_cache.untyped_storage().data_ptr()  # the attention layers hold views of the pool: not weights
    weights = held_bytes(
        [t for t in model_tensors(engine.model) if t.is_mkldnn or t.untyped_storage().data_ptr() != pool]
    )
    rows = timeline.report()
    peak = max(r["peak_rss_mb"] for r in rows)
    return {
        "model": str(path),
        "dtype": args.dtype,
        "stream": args.stream if path.is_dir() else None,
        "package": bool(args.key_file),
        "kernel_path": str(engine.kernel_path),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens": len(out),
        "weights_as_held_mb": _mb(weights),
        "kv_pool_mb": _mb(kv),
        "peak_rss_mb": peak,
        "hwm_mb": rows[-1]["hwm_at_end_mb"],
        "peak_over_weights_plus_kv": round(peak * 1e6 / (weights + kv), 3),
        "phases": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a GGUF file (native quant) or an HF directory")
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--kv-mib", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="an HF directory read whole before the build (checkpoint.load_hf_dir's default)",
    )
    ap.add_argument(
        "--key-file",
        help="--model is an encrypted package; this file holds its data key in hex "
        "(a bench package of random weights); --no-stream: decrypted whole before the build",
    )
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
