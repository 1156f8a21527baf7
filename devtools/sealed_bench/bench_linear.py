"""Dense fp32 matmul kernels for the engine's linear layers, interleaved on one machine.

One pass = every weight matrix of a SmolLM2-135M-shaped model (30 layers of fused QKV, O, fused
gate/up and down, plus the 49152-row LM head; random fp32 weights, 538 MB) applied to the same
activations, as one decode step does. Per batch size and round, the kernels run in a shuffled
order, so a shared machine's load falls on all of them alike; the summary is the median pass.

Kernels: `torch` (F.linear on a transposed storage), `openblas` (numpy's matmul on the same
memory; the engine's fp32 decode path until the kernel paths were fixed), `mkl-packed` (weights
packed once by MKL for sgemm, `torch.ops.mkl._mkl_linear`), `onednn-packed` (weights reordered once
into oneDNN's blocked layout, `torch.ops.mkldnn._linear_pointwise`), `onednn-plain` (the same op on the plain storage),
`panel` (column panels and the C++ kernel, layers/panel.py: the engine's fp32 CPU path).
Run: `sealed bench linear --batch 1,16,64 --threads 1 --rounds 15`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

KERNELS = ("torch", "openblas", "mkl-packed", "onednn-packed", "onednn-plain", "panel")
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # one layer: QKV, O, gate/up, down


def _weights(layers: int, vocab: int) -> list:
    import torch

    gen = torch.Generator().manual_seed(0)
    mats = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(layers) for n, k in SHAPES]
    mats.append(torch.randn(vocab, 576, generator=gen) * 0.02)
    # Stored [in, out] contiguous (the layout OpenBLAS streams fastest), read by torch as W's transposed view.
    return [w.t().contiguous().t() for w in mats]


def _pass_fns(weights: list, batch: int) -> dict[str, Callable[[dict], None]]:
    """One callable per kernel, each applying every matrix to x [batch, in] (x of the matching width)."""
    import numpy as np
    import torch

    from enclave_worker.engine.layers.panel import PanelMatmul

    f = torch.nn.functional
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, batch) for w in weights]
    dnn = [torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), batch) for w in weights]
    npw = [w.numpy().T for w in weights]
    panels = [PanelMatmul(w, consume=False) for w in weights]

    def torch_pass(xs: dict) -> None:
        for w in weights:
            f.linear(xs[w.shape[1]], w)

    def blas_pass(xs: dict) -> None:
        for w in npw:
            np.matmul(xs[w.shape[0]].numpy(), w)

    def mkl_pass(xs: dict) -> None:
        for w, p in zip(weights, mkl, strict=True):
            torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, batch)

    def dnn_pass(xs: dict) -> None:
        for w, p in zip(weights, dnn, strict=True):
            torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")

    def dnn_plain_pass(xs: dict) -> None:
        for w in weights:
            torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], w, None, "none", [], "")

    def panel_pass(xs: dict) -> None:
        for w, p in zip(weights, panels, strict=True):
            p(xs[w.shape[1]])

    return {"torch": torch_pass, "openblas": blas_pass, "mkl-packed": mkl_pass, "onednn-packed": dnn_pass,
            "onednn-plain": dnn_plain_pass, "panel": panel_pass}


def _max_error(weights: list, fns: dict, batch: int) -> dict[str, float]:
    """Each packed kernel's largest deviation from F.linear on one matrix of each shape."""
    import torch

    from enclave_worker.engine.layers.panel import PanelMatmul

    x = {k: torch.randn(batch, k) for k in (576, 1536)}
    out: dict[str, float] = {}
    for w in weights[:4]:
        ref = torch.nn.functional.linear(x[w.shape[1]], w)
        mkl = torch.ops.mkl._mkl_linear(x[w.shape[1]], torch.ops.mkl._mkl_reorder_linear_weight(w, batch), w,
                                        None, batch)
        dnn = torch.ops.mkldnn._linear_pointwise(
            x[w.shape[1]], torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), batch), None, "none", [], "")
        plain = torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], w, None, "none", [], "")
        panel = PanelMatmul(w, consume=False)(x[w.shape[1]])
        for name, y in (("mkl-packed", mkl), ("onednn-packed", dnn), ("onednn-plain", plain), ("panel", panel)):
            out[name] = max(out.get(name, 0.0), float((y - ref).abs().max()))
    return out


def run(batches: list[int], threads: int, rounds: int, layers: int, vocab: int) -> list[dict]:
    import torch

    torch.set_num_threads(threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads, user_api="blas")
    weights = _weights(layers, vocab)
    rows = []
    rng = random.Random(0)
    with torch.inference_mode():
        for batch in batches:
            fns = _pass_fns(weights, batch)
            xs = {k: torch.randn(batch, k) for k in (576, 1536)}
            for fn in fns.values():  # warm-up: first-touch of packed buffers, oneDNN primitive creation
                fn(xs)
            times: dict[str, list[float]] = {k: [] for k in KERNELS}
            for _ in range(rounds):
                order = list(KERNELS)
                rng.shuffle(order)
                for name in order:
                    start = time.perf_counter()
                    fns[name](xs)
                    times[name].append(time.perf_counter() - start)
            errors = _max_error(weights, fns, batch)
            base = statistics.median(times["torch"])
            blas = statistics.median(times["openblas"])
            for name in KERNELS:
                med = statistics.median(times[name])
                rows.append({"kernel": name, "batch": batch, "threads": threads, "rounds": rounds,
                             "median_ms": round(med * 1e3, 2), "min_ms": round(min(times[name]) * 1e3, 2),
                             "vs_torch": round(base / med, 3), "vs_openblas": round(blas / med, 3),
                             "max_abs_err_vs_torch": errors.get(name, 0.0)})
            del fns
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sealed bench linear", description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,16,64", help="comma-separated rows per matmul")
    ap.add_argument("--threads", type=int, default=1, help="torch / OpenBLAS threads")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=30, help="decoder layers (30: SmolLM2-135M)")
    ap.add_argument("--vocab", type=int, default=49152, help="LM head rows")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    rows = run([int(b) for b in args.batch.split(",")], args.threads, args.rounds, args.layers, args.vocab)
    print(f"{'kernel':<14} {'batch':>5} {'median ms':>10} {'min ms':>8} {'vs torch':>9} {'vs openblas':>12}")
    for r in rows:
        print(f"{r['kernel']:<14} {r['batch']:>5} {r['median_ms']:>10} {r['min_ms']:>8} {r['vs_torch']:>9} "
              f"{r['vs_openblas']:>12}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
