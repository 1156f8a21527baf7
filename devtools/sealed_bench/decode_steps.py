"""The engine's own timers for `sealed bench engine`'s decode figures, installed on a running engine
by the benchmark's worker (never by the product):

- `StepClock`: wall time of each full-batch decode step (the runner's prepare + execute on `batch`
  sequences, one token each: the forward pass and sampling), and each step's mean context;
- `OpTimers` (`--profile-decode`): for a few of those steps, wall time per op class (the q/k/v,
  o, gate/up and down projections, attention, the LM head, and the rest), with the bytes each must
  read and the FLOPs it must do (decode_bound.py's model), hence achieved GB/s and GFLOP/s per op,
  each beside its own bound at the machine's rates.

Timers wrap instance attributes (module forward hooks, `attend`, `as_lm_head`, the runner's
`prepare`/`execute`); `close()` removes them. CPU only: a CUDA step is asynchronous.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from sealed_bench.decode_bound import KV_BYTES, WEIGHT_BYTES, ModelDims

LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class OpTimers:
    """Per-op wall time, bytes and FLOPs of the steps run while `active`."""

    def __init__(self, model: Any, dims: ModelDims, dtype: str) -> None:
        self.dims, self.active, self.context_tokens = dims, False, 0
        self.wbytes, self.kvbytes = WEIGHT_BYTES[dtype], KV_BYTES[dtype]
        self.act_bytes = 2 if dtype == "bf16" else 4
        self.totals: dict[str, list[float]] = {}  # op -> [calls, seconds, bytes, flops]
        self._undo: list[Callable[[], None]] = []
        self._depth = 0
        for layer in model.decoder_layers:
            for name in LINEARS:
                self._hook_linear(getattr(layer, name), name)
            self._wrap(layer.attn, "attend", "attention", self._attention_cost)
        if model.lm_head is None:
            self._wrap(model.embed, "as_lm_head", "lm_head", self._linear_cost)
        else:
            self._hook_linear(model.lm_head, "lm_head")

    def _add(self, op: str, seconds: float, nbytes: float, flops: float) -> None:
        row = self.totals.setdefault(op, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += seconds
        row[2] += nbytes
        row[3] += flops

    def _linear_cost(self, x: Any, out: Any) -> tuple[float, float]:
        rows, n_in = x.shape[0], x.shape[-1]
        n_out = out.shape[-1]
        return n_in * n_out * self.wbytes + rows * (n_in + n_out) * self.act_bytes, 2.0 * rows * n_in * n_out

    def _attention_cost(self, q: Any, out: Any) -> tuple[float, float]:
        d = self.dims
        kv = self.context_tokens * 2 * d.kv_heads * d.head_dim * self.kvbytes
        return kv + (q.numel() + out.numel()) * self.act_bytes, 4.0 * d.heads * d.head_dim * self.context_tokens

    def _hook_linear(self, module: Any, op: str) -> None:
        started: list[float] = []

        def pre(_m: Any, _args: Any) -> None:
            if self.active:
                started.append(time.perf_counter())

        def post(_m: Any, args: Any, out: Any) -> None:
            if self.active and started:
                seconds = time.perf_counter() - started.pop()
                self._add(op, seconds, *self._linear_cost(args[0], out))

        handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        self._undo.extend(h.remove for h in handles)

    def _wrap(self, owner: Any, attr: str, op: str, cost: Callable[[Any, Any], tuple[float, float]]) -> None:
        inner = getattr(owner, attr)

        def timed(x: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.active or self._depth:
                return inner(x, *args, **kwargs)
            self._depth += 1
            started = time.perf_counter()
            try:
                out = inner(x, *args, **kwargs)
            finally:
                self._depth -= 1
            self._add(op, time.perf_counter() - started, *cost(x, out))
            return out

        setattr(owner, attr, timed)
        self._undo.append(lambda: owner.__dict__.pop(attr, None))

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def op_rows(totals: dict[str, list[float]], steps: int, step_s: float, copy_gbs: float,
            gflops: float) -> list[dict[str, Any]]:
    """Per step: each op's time, bytes, FLOPs, achieved rates and own bound; the rest of the step as
    "other" (norms, rotary + cache write, SiLU, embedding rows, sampling, Python), time only."""
    rows: list[dict[str, Any]] = []
    timed = 0.0
    for op, (calls, seconds, nbytes, flops) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        s, b, f = seconds / steps, nbytes / steps, flops / steps
        timed += s
        bound = max(b / (copy_gbs * 1e9), f / (gflops * 1e9))
        rows.append({"op": op, "calls_per_step": calls / steps, "ms_per_step": round(s * 1e3, 3),
                     "share": round(s / step_s, 3) if step_s else None, "mbytes_per_step": round(b / 1e6, 3),
                     "gflop_per_step": round(f / 1e9, 4), "gb_per_s": round(b / s / 1e9, 2) if s else None,
                     "gflop_per_s": round(f / s / 1e9, 2) if s else None, "bound_ms": round(bound * 1e3, 3),
                     "ratio_to_bound": round(s / bound, 2) if bound else None})
    rest = max(0.0, step_s - timed)
    rows.append({"op": "other", "ms_per_step": round(rest * 1e3, 3),
                 "share": round(rest / step_s, 3) if step_s else None})
    return rows


class StepClock:
    """Times the runner's full-batch decode steps; with `profile` OpTimers, profiles
    `profile_steps` of them once `skip` full-batch steps have run (past the first decodes)."""

    def __init__(self, runner: Any, batch: int, profile: OpTimers | None = None, profile_steps: int = 0,
                 skip: int = 4) -> None:
        self.runner, self.batch, self.profile = runner, batch, profile
        self.profile_steps, self.skip = profile_steps, skip
        self.steps: list[float] = []
        self.contexts: list[float] = []
        self.profiled: list[float] = []
        self._started = 0.0
        self._full = False
        self._n_full = 0  # full-batch decode steps begun
        prepare, execute = runner.prepare, runner.execute

        def timed_prepare(batch: list[Any]) -> Any:
            self._full = len(batch) == self.batch and all(s.num_tokens == 1 for s in batch)
            self._started = time.perf_counter()
            if self._full and self.profile is not None:
                self.profile.active = self.skip <= self._n_full < self.skip + self.profile_steps
                self.profile.context_tokens = sum(s.start + 1 for s in batch)
            self._n_full += self._full
            return prepare(batch)

        def timed_execute(batch: list[Any], *inputs: Any) -> Any:
            out = execute(batch, *inputs)
            if self._full:
                seconds = time.perf_counter() - self._started
                if self.profile is not None and self.profile.active:
                    self.profiled.append(seconds)
                    self.profile.active = False
                else:
                    self.steps.append(seconds)
                self.contexts.append(sum(s.start for s in batch) / len(batch))
            return out

        runner.prepare, runner.execute = timed_prepare, timed_execute

    def median_s(self) -> float | None:
        return statistics.median(self.steps) if self.steps else None

    def mean_context(self) -> float | None:
        return statistics.fmean(self.contexts) if self.contexts else None

    def close(self) -> None:
        for attr in ("prepare", "execute"):
            self.runner.__dict__.pop(attr, None)
        if self.profile is not None:
            self.profile.close()
