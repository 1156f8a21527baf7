"""Where the vLLM engine's serving cost goes (docs/vllm-backend.md, "Where the serving cost was").

Run in vLLM's virtualenv: `PYTHONPATH=. $SEALED_VLLM_PYTHON -m sealed_bench.vllm_step_probe`.
One process, one vLLM engine built by our loader from the default model. The same kind of batch
(random prompts, fixed output length, ``ignore_eos``) runs again and again with the variants
interleaved, so a loaded machine slows them alike. Each run reports the process's CPU time per
output token (getrusage: the work done, which a busy machine inflates far less than wall time,
except for threads that spin while they wait) and the median wall time of a decode step:

- ``linear``: torch's GEMM over the weight tensors (what the worker ran so that the revocation
  wipe reaches every weight byte) vs vLLM's oneDNN prepacked handles (vLLM's default, built here
  beside the weights for the comparison; the probe never wipes anything) vs torch's oneDNN
  prepacked MKLDNN tensors (``mkldnn``);
- ``threads``: torch intra-op threads for the stepping thread;
- ``driver``: a plain ``LLMEngine.step()`` loop vs our VllmEngine (its stepping thread, the
  asyncio consumers, our OutputProcessor), the worker's engine minus gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Variant:
    linear: str  # torch | onednn
    threads: int
    driver: str  # plain | adapter

    @property
    def name(self) -> str:
        return f"{self.driver}/{self.linear}/{self.threads}t"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Switches:
    """Per linear layer: torch's GEMM (as loaded by our loader), a oneDNN handle of the same weight
    (vLLM's default dispatch), or torch's own oneDNN prepacked MKLDNN tensor of it."""

    def __init__(self, model: torch.nn.Module) -> None:
        from vllm import _custom_ops as ops

        # vLLM's linear layers as our loader set them up, found by their attributes (`cpu_linear`, a
        # 2-D `weight`), which torch types only as `Tensor | Module`.
        self.layers: list[Any] = [m for m in model.modules() if hasattr(m, "cpu_linear")
                                  and getattr(m, "weight", None) is not None and m.weight.ndim == 2]
        self.fns: dict[str, dict[int, Callable[..., torch.Tensor]]] = {
            "torch": {id(m): m.cpu_linear for m in self.layers}, "onednn": {}, "mkldnn": {}}
        self.padded = 0
        for m in self.layers:
            handler = ops.create_onednn_mm(m.weight.t(), 32)
            self.fns["onednn"][id(m)] = lambda x, w, b, h=handler: ops.onednn_mm(h, x, b)
            packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), 32)
            self.padded += int(torch.ops.mkldnn._nbytes(packed) != m.weight.numel() * m.weight.element_size())
            self.fns["mkldnn"][id(m)] = (lambda x, w, b, p=packed:
                                         torch.ops.mkldnn._linear_pointwise(x, p, b, "none", [], ""))

    def use(self, linear: str) -> None:
        for m in self.layers:
            m.cpu_linear = self.fns[linear][id(m)]


class StepClock:
    """Wraps ``llm.step``: wall time per step, and the stepping thread's torch thread count set first
    (torch keeps that count per thread, and the adapter steps in its own thread)."""

    def __init__(self, llm: Any) -> None:
        self.inner = llm.step
        self.threads = 1
        self.steps: list[float] = []
        llm.step = self.step

    def step(self) -> Any:
        if torch.get_num_threads() != self.threads:
            torch._C.set_num_threads(self.threads)  # vLLM's CPU worker disables torch.set_num_threads
        started = time.perf_counter()
        out = self.inner()
        self.steps.append(time.perf_counter() - started)
        return out


def _prompts(seed: int, count: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)  # a fresh seed per run: no prefix-cache hits between runs
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(count)]


def _run_plain(llm: Any, prompts: list[list[int]], vparams: Any, tag: str) -> int:
    for i, p in enumerate(prompts):
        llm.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, vparams)
    tokens = 0
    while llm.has_unfinished_requests():
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.step())
    return tokens


async def _run_adapter(engine: Any, prompts: list[list[int]], params: Any, tag: str) -> int:
    async def one(rid: str, p: list[int]) -> int:
        return sum([len(out.delta_token_ids) async for out in engine.generate(rid, p, params)])

    return sum(await asyncio.gather(*[one(f"{tag}-{i}", p) for i, p in enumerate(prompts)]))


async def probe(args: argparse.Namespace) -> list[dict[str, Any]]:
    from api.tenant_tools import default_model_path
    from enclave_worker.engine.checkpoint import load_gguf
    from enclave_worker.engine.config import SamplingParams
    from enclave_worker.engine.tokenizer import Tokenizer
    from enclave_worker.package import DecryptedModel
    from enclave_worker.vllm_engine.engine import VllmEngine, vllm_sampling
    from enclave_worker.vllm_engine.runtime import VllmOptions, VllmRuntime

    ck = load_gguf(args.model or default_model_path())
    tensors = {k: v.to(torch.float32).contiguous().clone() for k, v in ck.tensors.items()}
    model = DecryptedModel(manifest=None, signer="probe", metadata={"config": ck.config},  # type: ignore[arg-type]
                           tensors=tensors, buffer=torch.zeros(1, dtype=torch.uint8))
    runtime = VllmRuntime(ck.config, lambda: model, VllmOptions(max_model_len=1024, max_num_seqs=args.batch,
                                                                kv_cache_memory_bytes=256 << 20, cpu_linear="torch"))
    engine = VllmEngine(runtime, Tokenizer(ck.tokenizer_json, ck.chat_template, ck.config))
    switches = Switches(runtime._model_runner().get_model())
    clock = StepClock(runtime.llm)
    params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
    vparams = vllm_sampling(params, args.output_len, ())
    print(json.dumps({"layers": len(switches.layers), "mkldnn_packs_with_padding": switches.padded}), flush=True)
    runtime.stepping_cpus = []  # the variants set the stepping thread's torch threads themselves, unpinned
    variants = [Variant(lin, t, "plain") for lin in args.linear for t in args.threads]
    variants += [Variant("torch", t, "adapter") for t in args.threads]
    vocab = int(ck.config["vocab_size"])
    rows = []
    for rnd in range(args.rounds + 1):  # round 0 warms every variant up and is not reported
        for k, v in enumerate(variants if rnd % 2 else list(reversed(variants))):
            switches.use(v.linear)
            clock.threads, clock.steps = v.threads, []
            prompts = _prompts(rnd * 100 + k, args.batch, args.input_len, vocab)
            cpu0, wall0 = _cpu_s(), time.perf_counter()
            if v.driver == "plain":
                tokens = _run_plain(runtime.llm, prompts, vparams, f"{rnd}-{k}")
            else:
                tokens = await _run_adapter(engine, prompts, params, f"{rnd}-{k}")
            cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
            decode = clock.steps[2:] or clock.steps  # the first steps hold the prefill
            row = {"variant": v.name, "round": rnd, "tokens": tokens, "wall_s": round(wall, 3),
                   "cpu_ms_per_token": round(1000 * cpu / tokens, 2),
                   "wall_ms_per_token": round(1000 * wall / tokens, 2),
                   "decode_step_ms_median": round(1000 * statistics.median(decode), 2),
                   "loadavg_1m": round(os.getloadavg()[0], 2)}
            if rnd:
                rows.append(row)
            print(json.dumps(row), flush=True)
    await engine.shutdown()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        out[name] = {key: statistics.median(r[key] for r in mine)
                     for key in ("cpu_ms_per_token", "wall_ms_per_token", "decode_step_ms_median")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: the default model, if installed)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--linear", nargs="+", default=["torch", "onednn", "mkldnn"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    args = parser.parse_args(argv)
    rows = asyncio.run(probe(args))
    print(json.dumps({"summary": summary(rows), "workload": vars(args), "cpus": os.cpu_count()}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
