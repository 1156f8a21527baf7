"""The configuration the benchmarks start their peers at, and what each result row records
(sealed_bench/peers.py): pure functions, no peer started."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from enclave_worker.vllm_cpu_binding import BIND_ENV, RESERVED_ENV, VllmCpuBinding, allowed_cpus, format_cpu_list
from sealed_bench import bench_engine, bench_vllmload, bench_vllmserve
from sealed_bench.peers import add_peer_options, llama_cpp_peer, peer_env, vllm_binding, vllm_peer


def test_vllm_computes_on_every_allowed_cpu_with_none_reserved_by_default() -> None:
    peer = vllm_peer(VllmCpuBinding(), [0, 1], "float32", peer="vllm serve")
    assert peer.env == {BIND_ENV: "0-1", RESERVED_ENV: "0"}
    assert peer.threads == 2 and peer.binding == "0-1"
    row = peer.record()
    assert row == {"peer": "vllm serve", "dtype": "float32", "threads": 2, "binding": "0-1",
                   "label": "all cores bound for compute, none reserved", "env": {BIND_ENV: "0-1", RESERVED_ENV: "0"}}


def test_vllms_default_binding_is_recorded_as_such() -> None:
    row = vllm_peer(VllmCpuBinding("auto"), [0, 1], "float32").record()
    assert row["threads"] is None and row["binding"] == "vllm auto"
    assert row["env"] == {BIND_ENV: "auto"} and "default" in row["label"]


def test_the_peers_environment_replaces_an_inherited_binding() -> None:
    base = {"PATH": "/bin", BIND_ENV: "auto", RESERVED_ENV: "1"}
    env = peer_env(base, vllm_peer(VllmCpuBinding(), [0, 1, 2, 3], "float32"))
    assert env == {"PATH": "/bin", BIND_ENV: "0-3", RESERVED_ENV: "0"}
    env = peer_env(base, vllm_peer(VllmCpuBinding("auto"), [0, 1], "float32"))
    assert env == {"PATH": "/bin", BIND_ENV: "auto"}  # vLLM's own reserved default, not the inherited 1
    assert base[RESERVED_ENV] == "1"  # the caller's mapping is left as it was


def test_llama_cpp_gets_a_thread_per_allowed_cpu_unless_told_otherwise() -> None:
    peer = llama_cpp_peer([0, 1, 2], "fp32")
    assert peer.threads == 3 and peer.label == "all threads"
    assert peer.record()["peer"] == "llama.cpp"
    assert llama_cpp_peer([0, 1, 2], "fp32", threads=1).label == "1 threads of 3 CPUs"
    with pytest.raises(ValueError):
        llama_cpp_peer([0, 1], "fp32", threads=0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_peer_options(parser)
    return parser


def test_the_binding_options_default_to_all_cores() -> None:
    parser = _parser()
    assert vllm_binding(parser.parse_args([]), parser) == VllmCpuBinding()
    args = parser.parse_args(["--vllm-cpu-bind", "auto", "--vllm-reserved-cpus", "0"])
    assert vllm_binding(args, parser) == VllmCpuBinding("auto", 0)


@pytest.mark.parametrize("bad", [["--vllm-cpu-bind", "nonsense"], ["--vllm-reserved-cpus", "1"],
                                 ["--vllm-cpu-bind", "100000"]])
def test_a_bad_binding_is_a_usage_error(bad: list[str]) -> None:
    parser = _parser()
    with pytest.raises(SystemExit) as exc:
        vllm_binding(parser.parse_args(bad), parser)
    assert exc.value.code == 2


@pytest.mark.parametrize("main", [bench_engine.main, bench_vllmload.main, bench_vllmserve.main])
def test_every_benchmark_that_runs_vllm_refuses_a_bad_binding_before_it_starts_anything(main) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["--vllm-cpu-bind", "0-x"])
    assert exc.value.code == 2


def test_the_sealed_side_of_vllmserve_is_recorded_beside_the_peer() -> None:
    side = bench_vllmserve.sealed_side("vllm")
    assert side["engine"] == "vllm" and side["vllm_cpu_bind"] == "all" and side["dtype"] == "float32"
    assert side["env"] == {BIND_ENV: format_cpu_list(allowed_cpus()), RESERVED_ENV: "0"}
    assert bench_vllmserve.sealed_side("sealed")["engine"] == "sealed"


def test_each_vllmserve_pair_serves_prompts_no_earlier_pair_served() -> None:
    # One seed for every run let each server meet its own earlier prompts from the second pair on
    # and answer them from its prefix cache; both servers of one pair get the same prompts.
    args = argparse.Namespace(input_len=128, output_len=128, num_prompts=64, concurrency=16, goodput=[])
    seeds = bench_vllmserve.pair_seeds(3)
    assert len(set(seeds)) == 3
    for seed in seeds:
        cmd = bench_vllmserve.bench_command("py", "http://x", Path("/t"), Path("/o/r.json"), args, seed)
        assert cmd[cmd.index("--seed") + 1] == str(seed)


def test_vllmserve_checks_every_target_of_issue_38_for_our_engine() -> None:
    peer = {"median_output_throughput": 50.0, "median_median_ttft_ms": 3000.0, "median_median_tpot_ms": 250.0,
            "median_request_goodput": 0.1}
    fast = {"median_output_throughput": 65.0, "median_median_ttft_ms": 2000.0, "median_median_tpot_ms": 240.0,
            "median_request_goodput": 0.2}
    assert all(bench_vllmserve.engine_targets({"sealed": fast, "plain": peer}).values())
    for key, worse in (("median_output_throughput", 64.0), ("median_median_ttft_ms", 3001.0),
                       ("median_median_tpot_ms", 251.0), ("median_request_goodput", 0.05)):
        checks = bench_vllmserve.engine_targets({"sealed": fast | {key: worse}, "plain": peer})
        assert list(checks.values()).count(False) == 1, (key, checks)
