"""`sealed bench llamaserve`: our engine in the attested stack beside llama.cpp's `llama-server`, same GGUF.

    sealed bench make-model --shape llama-3.2-1b --out DIR --gguf Q8_0
    sealed bench llamaserve --model-dir DIR --quant Q8_0 [--pairs 3 --num-prompts 64 --concurrency 16]

Both servers load the one file DIR/model-<QUANT>.gguf, so both tokenize with its tokenizer (checked:
one request's prompt_tokens must be equal on both sides before anything is measured). Ours:
`sealed up --model GGUF --gguf-quant native` (gateway, key broker, attested worker decrypting the
package): Q4_0 keeps its codes and block scales as the int4 kernel's, Q8_0 its codes and block scales as
the int8 block kernel's, which quantizes activations per block of 32 as llama.cpp does (docs/engine.md).
The peer: `llama-server` (llama_side.py) at the GGUF's own type, one thread per CPU this process may use,
`--parallel` slots, continuous batching. Both under `vllm bench serve` (random input,
--ignore-eos, the DIR's tokenizer), in alternating pairs, every pair on fresh prompts. The
figures: output throughput, TTFT and TPOT p50 per run with the load average around it; the ratio of
medians; issue 49's targets (ours >= 1.0x llama-server, TPOT p50 no higher).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from enclave_worker.vllm_cpu_binding import allowed_cpus
from sealed_bench.bench_vllmserve import SERVED, _bench, _stop, _summary, _wait, pair_seeds
from sealed_bench.llama_side import LlamaServerConfig, LlamaServerNotFound, find_llama_server
from sealed_bench.peers import llama_cpp_peer
from sealed_bench.processes import REPO, source_pythonpath
from sealed_bench.vllm_side import add_vllm_options, machine, vllm_interpreter

OURS = {"Q8_0": "int8 blocks of 32: Q8_0's codes and scales kept, activations quantized per row and block of 32",
        "Q4_0": "int4, Q4_0's codes and per-32 scales kept (bf16-rounded scales)"}
# `--gguf-quant fp32`: the file's values exactly, dequantized at encryption and held by the engine as
# their block codes (coded panels: int8 codes, an fp32 scale and offset per 32; fp32 multiply-adds).
EXACT = "the GGUF's exact values as block codes (int8 codes, fp32 scale and offset per 32; fp32 compute)"
PROBE = "Name three rivers of Europe and say which sea each flows into."


class PromptTokensDiffer(RuntimeError):
    """The two servers count a prompt differently: they would not be given the same work."""


def cpu() -> dict[str, Any]:
    """The CPU's model line and vector width, from /proc/cpuinfo (first processor)."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {"model_name": fields.get("model name"), "family": fields.get("cpu family"), "model": fields.get("model"),
            "avx512f": "avx512f" in flags, "avx2": "avx2" in flags,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def prompt_tokens(url: str, api_key: str) -> int:
    """The prompt tokens the server at URL counts for one fixed chat message."""
    resp = httpx.post(f"{url}/v1/chat/completions", timeout=600, headers={"Authorization": f"Bearer {api_key}"},
                      json={"model": SERVED, "max_tokens": 1, "messages": [{"role": "user", "content": PROBE}]})
    resp.raise_for_status()
    return int(resp.json()["usage"]["prompt_tokens"])


def _targets(summary: dict[str, dict[str, float | None]]) -> dict[str, bool]:
    def med(side: str, key: str) -> float:
        value = summary[side][f"median_{key}"]
        return float("nan") if value is None else value

    return {"throughput_1_0x": med("sealed", "output_throughput") >= med("llama", "output_throughput"),
            "tpot_p50_no_higher": med("sealed", "median_tpot_ms") <= med("llama", "median_tpot_ms"),
            # A side that dropped requests served less work: its throughput does not compare.
            "every_request_completed": all(summary[side]["all_completed"] for side in ("sealed", "llama"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench llamaserve", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="made by `sealed bench make-model ... --gguf QUANT` (its tokenizer and model-QUANT.gguf)")
    parser.add_argument("--quant", choices=sorted(OURS), default="Q8_0")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=3, help="alternating runs per server")
    parser.add_argument("--parallel", type=int, default=16, help="llama-server's slots")
    parser.add_argument("--threads", type=int, default=None, help="llama-server's threads (default: one per CPU)")
    parser.add_argument("--gguf-quant", choices=("native", "fp32"), default="native",
                        help="ours: `sealed up --gguf-quant` (native: the int8/int4 kernels; fp32: exact block codes)")
    add_vllm_options(parser)
    args = parser.parse_args(argv)
    args.goodput = []  # bench_command's option, not offered here
    gguf = args.model_dir / f"model-{args.quant}.gguf"
    if not gguf.is_file() or not (args.model_dir / "tokenizer.json").is_file():
        parser.error(f"{args.model_dir} has no model-{args.quant}.gguf and tokenizer.json: make it with "
                     f"`sealed bench make-model --gguf {args.quant}`")
    if min(args.num_prompts, args.input_len, args.output_len, args.concurrency, args.pairs, args.parallel) < 1:
        parser.error("--num-prompts, --input-len, --output-len, --concurrency, --pairs and --parallel must be >= 1")
    try:
        binary = find_llama_server()
        peer = llama_cpp_peer(allowed_cpus(), args.quant, args.threads)
    except (LlamaServerNotFound, ValueError) as exc:
        parser.error(str(exc))
    from api.stack import free_port

    python = vllm_interpreter(args)
    sealed_port, llama_port = free_port(), free_port()
    # A slot holds the chat template's tokens besides the prompt and the answer, and vllm's random prompts
    # re-tokenize longer than asked: at twice what they need (512 tokens at 128/128) llama-server dropped 4-10 of
    # 64 requests on 2026-12-07, so four times.
    llama = LlamaServerConfig(binary, gguf.resolve(), SERVED, llama_port, peer.threads or 1, args.parallel,
                              4 * (args.input_len + args.output_len))
    precision = OURS[args.quant] if args.gguf_quant == "native" else EXACT
    configs = {"sealed": {"engine": "sealed", "threads": len(allowed_cpus()), "precision": precision,
                          "command": ["sealed", "up", "--model", gguf.name, "--gguf-quant", args.gguf_quant]},
               "llama": llama.record(peer)}
    root = Path(tempfile.mkdtemp(prefix="sealed-bench-llamaserve-"))
    procs: list[subprocess.Popen] = []
    runs: dict[str, list[dict]] = {"sealed": [], "llama": []}
    try:
        env = {**os.environ, "SEALED_HOME": str(root / "home"), "PYTHONPATH": source_pythonpath()}
        procs.append(subprocess.Popen([sys.executable, "-m", "api.cli.main", "up", "--model", str(gguf.resolve()),
                                       "--gguf-quant", args.gguf_quant, "--port", str(sealed_port)], env=env, cwd=REPO,
                                      start_new_session=True, stdout=open(root / "up.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT))
        _wait(f"http://127.0.0.1:{sealed_port}/readyz", procs[-1], 1800)
        api_key = (root / "home" / "demo" / "api-key").read_text().strip()
        procs.append(subprocess.Popen(llama.command(), cwd=root, start_new_session=True,
                                      stdout=open(root / "llama-server.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT))
        _wait(f"http://127.0.0.1:{llama_port}/health", procs[-1], 600)
        urls = {"sealed": f"http://127.0.0.1:{sealed_port}", "llama": f"http://127.0.0.1:{llama_port}"}
        keys = {"sealed": api_key, "llama": "none"}
        counted = {name: prompt_tokens(urls[name], keys[name]) for name in urls}
        if counted["sealed"] != counted["llama"]:
            raise PromptTokensDiffer(f"one chat message is {counted['sealed']} prompt tokens to our stack and "
                                     f"{counted['llama']} to llama-server: their tokenizers or templates differ")
        for i, seed in enumerate(pair_seeds(args.pairs)):
            for name in (("sealed", "llama") if i % 2 == 0 else ("llama", "sealed")):
                load_before = os.getloadavg()
                row = _bench(python, urls[name], args.model_dir.resolve(), root / f"{name}-{i}.json", args,
                             keys[name], seed)
                runs[name].append(row | {"seed": seed, "loadavg_before": load_before,
                                         "loadavg_after": os.getloadavg()})
                print(name, json.dumps(runs[name][-1]), flush=True)
    except BaseException:
        for log in ("up.log", "llama-server.log"):
            if (root / log).is_file():
                print(f"--- {log} (last lines)\n" + (root / log).read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
    med = {name: statistics.median(r["output_throughput"] for r in rs) for name, rs in runs.items()}
    summary = {name: _summary(rs) | {"all_completed": all(r.get("completed") == args.num_prompts for r in rs)}
               for name, rs in runs.items()}
    checks = _targets(summary)
    pairs = [round(s["output_throughput"] / p["output_throughput"], 4) if p["output_throughput"] else None
             for s, p in zip(runs["sealed"], runs["llama"], strict=True)]
    result = {"benchmark": "llamaserve", "quant": args.quant, "runs": runs, "summary": summary,
              "median_output_tok_per_s": med, "ratio": round(med["sealed"] / med["llama"], 4), "pair_ratios": pairs,
              "prompt_tokens_probe": counted, "target": "ratio >= 1.0x llama-server; TPOT p50 <= llama-server's",
              "checks": checks, "met": all(checks.values()),
              "workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "configs": configs, "machine": machine() | {"cpu": cpu()}}
    for name, row in summary.items():
        print(name, json.dumps(row))
    print(f"attested stack ({precision}) {med['sealed']:.1f} tok/s vs llama-server {args.quant} "
          f"{med['llama']:.1f} tok/s: {result['ratio']:.2f}x (target >= 1.0x); "
          + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in checks.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0
