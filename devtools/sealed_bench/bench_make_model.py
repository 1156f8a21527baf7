"""`sealed bench make-model`: an HF checkpoint of a real architecture's shapes, seeded random weights.

    sealed bench make-model --shape llama-3.2-1b --dtype bf16 --out /tmp/l1b [--gguf Q8_0] [--layers 2]

Writes config.json, sharded safetensors with their index, tokenizer.json and tokenizer_config.json
(SmolLM2's tokenizer padded to the vocabulary, its chat template) into OUT, and with --gguf a GGUF of
the same values beside it (OUT/model-<TYPE>.gguf). Memory stays flat whatever the size
(make_model.py). --json FILE reports what was written and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from sealed_bench.make_model import DEFAULT_SHARD_BYTES, DTYPES, SHAPES, MakeModelError, model_config, write_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench make-model", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--out", type=Path, required=True, help="directory to create (must be absent or empty)")
    parser.add_argument("--gguf", default=None, help="also write OUT/model-<TYPE>.gguf: Q8_0 or Q4_0 "
                                                     "(gguf's quantizer; Q4_K is refused: it needs llama-quantize)")
    parser.add_argument("--layers", type=int, default=None, help="keep only the first N layers (tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-mib", type=int, default=DEFAULT_SHARD_BYTES >> 20)
    parser.add_argument("--json", type=Path, default=None, help="write a report here")
    args = parser.parse_args(argv)
    try:
        config = model_config(args.shape, args.dtype, args.layers)
        if args.gguf is not None:
            from sealed_bench.make_model_gguf import GGUF_TYPES

            if args.gguf not in GGUF_TYPES:  # before anything is written
                raise MakeModelError(f"--gguf {args.gguf}: gguf's quantizer writes {', '.join(GGUF_TYPES)} "
                                     "only (Q4_K needs llama.cpp's llama-quantize)")
        start = time.perf_counter()
        made = write_checkpoint(args.out, config, seed=args.seed, shard_bytes=args.shard_mib << 20)
        report = {"shape": args.shape, "dtype": args.dtype, "layers": config["num_hidden_layers"],
                  "out": str(made.out), "weights_bytes": made.total_bytes, "shards": len(made.shards),
                  "hf_seconds": round(time.perf_counter() - start, 2)}
        if args.gguf is not None:
            from sealed_bench.make_model_gguf import write_gguf

            start = time.perf_counter()
            gguf_path = write_gguf(made.out, made.out / f"model-{args.gguf}.gguf", args.gguf, seed=args.seed)
            report.update(gguf=str(gguf_path), gguf_bytes=gguf_path.stat().st_size,
                          gguf_seconds=round(time.perf_counter() - start, 2))
    except MakeModelError as exc:
        print(f"sealed bench make-model: {exc}", file=sys.stderr)
        return 2
    report["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
