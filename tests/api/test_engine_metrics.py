"""vLLM workers' engine metrics reach the gateway's Prometheus registry under their vLLM names."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import generate_latest

from api.gateway.metrics import EngineMetrics, Metrics


def test_vllm_metrics_from_heartbeats_are_exported_per_worker_and_other_stats_are_not() -> None:
    workers = [
        SimpleNamespace(worker_id="w1", model="m", stats={
            "vllm:num_requests_running": 2, "num_running": 2, "vllm:prompt_tokens": 120.0,
            "vllm:e2e_request_latency_seconds_count": 3}),
        SimpleNamespace(worker_id="w2", model="m", stats={"num_running": 1}),  # our engine: no vllm: keys
    ]
    metrics = Metrics(lambda: 0.0, lambda: 0.0)
    metrics.registry.register(EngineMetrics(lambda: workers))
    text = generate_latest(metrics.registry).decode()
    assert 'vllm:num_requests_running{model_name="m",worker="w1"} 2.0' in text
    assert 'vllm:prompt_tokens{model_name="m",worker="w1"} 120.0' in text
    assert "vllm:e2e_request_latency_seconds_count" in text
    assert 'worker="w2"' not in text
    workers.clear()  # a worker gone: its series goes with it
    assert "vllm:" not in generate_latest(metrics.registry).decode()


def test_cold_start_phases_are_exported_per_worker_and_unknown_sealed_stats_are_not() -> None:
    workers = [SimpleNamespace(worker_id="w1", model="m", stats={
        "sealed:cold_start_decrypt_seconds": 1.5, "sealed:cold_start_first_token_seconds": 0.25,
        "sealed:other": 3, "sealed:cold_start_load_seconds": "1"})]  # a string is never a gauge
    metrics = Metrics(lambda: 0.0, lambda: 0.0)
    metrics.registry.register(EngineMetrics(lambda: workers))
    text = generate_latest(metrics.registry).decode()
    assert 'sealed:cold_start_decrypt_seconds{model_name="m",worker="w1"} 1.5' in text
    assert 'sealed:cold_start_first_token_seconds{model_name="m",worker="w1"} 0.25' in text
    assert "phase first_token" in text
    assert "sealed:other" not in text and "cold_start_load" not in text
