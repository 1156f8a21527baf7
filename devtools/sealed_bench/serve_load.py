"""The load generator of `sealed bench serve` (and its sealed pairs, serve_sealed.py): prompts,
Poisson arrivals over streamed OpenAI requests, per-request timings and their summary."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WORDS = (
    "time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand", "part", "child", "eye",
    "woman", "place", "work", "week", "case", "point", "government", "company", "number", "group", "problem",
    "fact", "river", "mountain", "cloud", "signal", "engine", "garden", "market", "letter", "window",
    "story", "music", "paper", "system", "science", "ocean", "forest", "city", "bridge", "light", "winter",
    "summer",
)


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""


def load_tokenizer(gguf: Path | None) -> Any:
    """The served model's tokenizer, read from the GGUF's metadata (no tensors are loaded)."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer

    from enclave_worker.engine.checkpoint import default_gguf_path
    from enclave_worker.engine.gguf_tokenizer import gguf_tokenizer_json

    reader = GGUFReader(str(gguf or default_gguf_path()))

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    return Tokenizer.from_str(gguf_tokenizer_json(field))


def make_prompts(n: int, input_len: int, seed: int, tokenizer: Any) -> list[str]:
    """N prompts of exactly INPUT_LEN tokens each, as `vllm bench serve --dataset-name random` makes them:
    random words, then trimmed or padded token by token until re-encoding gives the asked length."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(input_len))
        ids = tokenizer.encode(text, add_special_tokens=False).ids[:input_len]
        for _attempt in range(64):
            text = tokenizer.decode(ids)
            got = tokenizer.encode(text, add_special_tokens=False).ids
            if len(got) == input_len:
                break
            # A decode/re-encode round trip can merge or split at the edges: fix the length and retry.
            ids = (got + [tokenizer.token_to_id(" " + rng.choice(WORDS)) or got[-1]] * input_len)[:input_len]
        else:
            raise RuntimeError(f"could not make a prompt of exactly {input_len} tokens")
        prompts.append(text)
    return prompts


class FreshPrompts:
    """A new prompt set for every run: a prompt served before hits the engine's prefix cache, so a
    run reusing an earlier run's prompts measures a cache hit (and favours whichever mode came later)."""

    def __init__(self, n: int, input_len: int, seed: int, tokenizer: Any) -> None:
        self._shape, self._tokenizer = (n, input_len), tokenizer
        self.seed = seed
        self.drawn = 0

    def next_seed(self) -> int:
        """The seed of the next set (also handed to a peer's own generator: vllm bench serve --seed)."""
        seed = self.seed + 7919 * self.drawn
        self.drawn += 1
        return seed

    def next(self) -> list[str]:
        n, input_len = self._shape
        return make_prompts(n, input_len, self.next_seed(), self._tokenizer)


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: str, output_len: int,
              ignore_eos: bool) -> Result:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    res, start = Result(ok=False), time.perf_counter()
    last = start
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if "error" in doc:
                    res.error = doc["error"].get("message", "stream error")
                    return res
                if doc.get("usage"):
                    res.prompt_tokens = doc["usage"]["prompt_tokens"]
                    res.output_tokens = doc["usage"]["completion_tokens"]
                if doc.get("choices") and doc["choices"][0].get("text"):
                    now = time.perf_counter()
                    if res.ttft == 0.0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2el = time.perf_counter() - start
        res.ok = res.ttft > 0
    except Exception as exc:  # httpx, httpx2 (sealed) and sealed-mode errors all count as failures
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def _sealed_client(url: str, api_key: str, policy: Path, unsafe_allow_simulated: bool, connections: int) -> Any:
    """An httpx2 client whose transport seals every request (sealed_client), as SealedOpenAI does."""
    import httpx2

    from sealed_client.deployment import ClientTrust
    from sealed_client.session import SealedSession
    from sealed_client.transport import AsyncSealedTransport

    session = SealedSession(ClientTrust.load(policy, unsafe_allow_simulated=unsafe_allow_simulated))
    inner = httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=connections,
                                                           max_keepalive_connections=connections))
    return httpx2.AsyncClient(transport=AsyncSealedTransport(session, url, inner), timeout=httpx2.Timeout(3600.0),
                              headers={"Authorization": f"Bearer {api_key}"})


async def run_load(url: str, model: str, api_key: str, prompts: list[str], output_len: int, rate: float,
                   max_concurrency: int | None, seed: int, ignore_eos: bool, sealed_policy: Path | None = None,
                   unsafe_allow_simulated: bool = False, on_start: Any = None,
                   gate: asyncio.Barrier | None = None) -> tuple[list[Result], float]:
    rng = random.Random(seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    connections = max(len(prompts), 10)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    client_cm = (_sealed_client(url, api_key, sealed_policy, unsafe_allow_simulated, connections) if sealed_policy
                 else httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits,
                                        headers={"Authorization": f"Bearer {api_key}"}))
    async with client_cm as client:
        # One short request before the clock starts, in both modes: connections, and in sealed mode
        # the deployment's verification, which a client does once. Not one of the measured prompts:
        # that one would then be a prefix-cache hit.
        await one(client, url, model, "warm up", 2, False)
        async def limited(p: str) -> Result:
            if limit is None:
                return await one(client, url, model, p, output_len, ignore_eos)
            async with limit:
                return await one(client, url, model, p, output_len, ignore_eos)

        if gate is not None:
            await gate.wait()  # --mixed: the other mode's load starts at the same moment
        if on_start is not None:
            on_start()  # the clock starts: what the caller measures (CPU time) starts here too
        tasks, start = [], time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(limited(p)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    k = (len(ordered) - 1) * 0.99  # linear interpolation, as numpy.percentile
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    p99 = ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
    return {"mean": statistics.fmean(values) * 1000, "median": statistics.median(values) * 1000, "p99": p99 * 1000}


def summarize(results: list[Result], duration: float, slos: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    good = 0
    for r in ok:
        t = (r.e2el - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        measured = {"ttft": r.ttft * 1000, "tpot": t * 1000, "e2el": r.e2el * 1000}
        good += all(measured[k] <= v for k, v in slos.items())
    out_tokens, in_tokens = sum(r.output_tokens for r in ok), sum(r.prompt_tokens for r in ok)
    summary = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": _stats([r.ttft for r in ok]), "tpot_ms": _stats(tpot),
        "itl_ms": _stats([x for r in ok for x in r.itl]), "e2el_ms": _stats([r.e2el for r in ok]),
        "errors": sorted({r.error for r in results if r.error})[:5],
    }
    if slos:
        summary["goodput"] = good / duration
        summary["slos_ms"] = slos
    return summary


def print_summary(name: str, s: dict[str, Any]) -> None:
    print(f"============ Serving Benchmark Result: {name} ============")
    print(f"Successful requests: {s['completed']}   failed: {s['failed']}   duration: {s['duration_s']:.2f} s")
    print(f"Request throughput (req/s): {s['request_throughput']:.2f}   output tok/s: {s['output_throughput']:.2f}"
          f"   total tok/s: {s['total_token_throughput']:.2f}")
    if "goodput" in s:
        print(f"Request goodput (req/s): {s['goodput']:.2f}")
    for m in ("ttft", "tpot", "itl", "e2el"):
        st = s[f"{m}_ms"]
        print(f"{m.upper():5s} ms  mean {st['mean']:9.2f}  median {st['median']:9.2f}  p99 {st['p99']:9.2f}")
