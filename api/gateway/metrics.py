"""Prometheus metrics with vLLM's names (prefix `sealed:` where vLLM uses `vllm:`), one registry per app."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)


class Metrics:
    def __init__(self, running: Callable[[], float], waiting: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("sealed:time_to_first_token_seconds", "Time to first token", ["model_name"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sealed:inter_token_latency_seconds", "Time between streamed chunks", ["model_name"],
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("sealed:e2e_request_latency_seconds", "End-to-end request latency", ["model_name"],
                             buckets=LATENCY_BUCKETS, registry=r)
        Gauge("sealed:num_requests_running", "Requests dispatched to workers", registry=r).set_function(running)
        self.dispatch_slots = Gauge("sealed:dispatch_slots", "Dispatch slots now (adaptive, up to --max-inflight)",
                                    registry=r)
        Gauge("sealed:num_requests_waiting", "Requests in the gateway's fair queue", registry=r
              ).set_function(waiting)
        self.kv_cache = Gauge("sealed:kv_cache_usage_perc", "KV-cache usage per worker (0-1)",
                              ["worker", "model_name"], registry=r)
        self.worker_waiting = Gauge("sealed:worker_num_requests_waiting", "Requests waiting inside a worker",
                                    ["worker", "model_name"], registry=r)
        self.prompt_tokens = Counter("sealed:prompt_tokens", "Prompt tokens per tenant", ["tenant", "model_name"],
                                     registry=r)
        self.generation_tokens = Counter("sealed:generation_tokens", "Generated tokens per tenant",
                                         ["tenant", "model_name"], registry=r)
        self.requests = Counter("sealed:request_success", "Finished requests", ["tenant", "finished_reason"],
                                registry=r)
        self.rejected = Counter("sealed:request_rejected", "Requests refused by admission", ["tenant", "reason"],
                                registry=r)
        self.worker_seconds = Counter("sealed:worker_seconds", "Worker time per tenant (signed usage)",
                                      ["tenant"], registry=r)


COLD_START = "sealed:cold_start_"  # enclave_worker/cold_start.py: one gauge per phase of a worker's start
_EXPORTED = ("vllm:", COLD_START)


class EngineMetrics:
    """The metrics a vLLM worker's engine reports in its heartbeat (`vllm:...`, label sets summed
    in the worker), exported here under their vLLM names, one series per worker; and every worker's
    cold-start phases (`sealed:cold_start_<phase>_seconds`)."""

    def __init__(self, workers: Callable[[], Iterable[Any]]) -> None:
        self.workers = workers

    def describe(self) -> list:  # no fixed families: they are whatever the workers report
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for worker in list(self.workers()):
            for name, value in (worker.stats or {}).items():
                if not (isinstance(name, str) and name.startswith(_EXPORTED) and isinstance(value, int | float)):
                    continue
                if name not in families:
                    what = f"vLLM {name[5:]} (from the worker's engine)" if name.startswith("vllm:") else \
                        f"Seconds of the worker's start in phase {name[len(COLD_START):-len('_seconds')]}"
                    families[name] = GaugeMetricFamily(name, what, labels=["worker", "model_name"])
                families[name].add_metric([worker.worker_id, worker.model], float(value))
        yield from families.values()
