"""The CPU binding the worker and the benchmarks give vLLM (enclave_worker/vllm_cpu_binding.py):
pure functions of the binding and the CPUs allowed; no vLLM started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from enclave_worker.settings import WorkerSettings
from enclave_worker.vllm_cpu_binding import (
    BIND_ENV,
    RESERVED_ENV,
    CpuBindingError,
    VllmCpuBinding,
    allowed_cpus,
    apply,
    format_cpu_list,
    parse_cpu_list,
)


def test_cpu_lists_round_trip_in_the_form_vllm_parses() -> None:
    assert parse_cpu_list("0-3,6") == (0, 1, 2, 3, 6)
    assert parse_cpu_list(" 5, 2-4 ") == (2, 3, 4, 5)
    assert format_cpu_list([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert format_cpu_list([3]) == "3"
    assert parse_cpu_list(format_cpu_list(range(0, 64, 3))) == tuple(range(0, 64, 3))


@pytest.mark.parametrize("bad", ["", "x", "0-", "3-1", "-1", "0,,1", "0-1-2"])
def test_a_malformed_cpu_list_is_refused(bad: str) -> None:
    with pytest.raises(CpuBindingError):
        parse_cpu_list(bad)
    with pytest.raises(CpuBindingError):
        VllmCpuBinding(bad)


def test_the_default_binds_every_allowed_cpu_and_reserves_none() -> None:
    env = VllmCpuBinding().env([0, 1])
    assert env == {BIND_ENV: "0-1", RESERVED_ENV: "0"}
    # the affinity mask, not the machine's CPU count: a container limited to CPUs 2, 3 and 7
    assert VllmCpuBinding().env([7, 2, 3]) == {BIND_ENV: "2-3,7", RESERVED_ENV: "0"}
    assert VllmCpuBinding().cpus([1, 0]) == (0, 1)


def test_auto_is_vllms_default_with_its_reserved_count_or_one_given() -> None:
    assert VllmCpuBinding("auto").env([0, 1]) == {BIND_ENV: "auto"}
    assert VllmCpuBinding("auto").cpus([0, 1]) is None
    assert VllmCpuBinding("auto", reserved=0).env([0, 1]) == {BIND_ENV: "auto", RESERVED_ENV: "0"}
    assert "default" in VllmCpuBinding("auto").label()


def test_an_explicit_list_binds_those_cpus_only_if_this_process_may_use_them() -> None:
    assert VllmCpuBinding("1").env([0, 1]) == {BIND_ENV: "1", RESERVED_ENV: "0"}
    with pytest.raises(CpuBindingError, match="2"):
        VllmCpuBinding("0-2").env([0, 1])


def test_a_reserved_count_beside_an_explicit_binding_is_refused() -> None:
    """vLLM reads VLLM_CPU_NUM_OF_RESERVED_CPU under `auto` only: beside a list it would be ignored."""
    with pytest.raises(CpuBindingError, match="auto"):
        VllmCpuBinding("all", reserved=1)
    with pytest.raises(CpuBindingError, match="auto"):
        VllmCpuBinding("0-1", reserved=0)
    with pytest.raises(CpuBindingError, match=">= 0"):
        VllmCpuBinding("auto", reserved=-1)


def test_apply_sets_the_binding_and_drops_an_inherited_reserved_count() -> None:
    environ = {BIND_ENV: "auto", RESERVED_ENV: "1", "OTHER": "x"}
    values = apply(VllmCpuBinding(), environ)
    assert environ == {BIND_ENV: format_cpu_list(allowed_cpus()), RESERVED_ENV: "0", "OTHER": "x"}
    assert values == {k: environ[k] for k in (BIND_ENV, RESERVED_ENV)}
    environ = {RESERVED_ENV: "1"}
    apply(VllmCpuBinding("auto"), environ)
    assert environ == {BIND_ENV: "auto"}


def test_allowed_cpus_is_this_processs_affinity() -> None:
    assert allowed_cpus() == tuple(sorted(os.sched_getaffinity(0)))


def _settings(**kw: object) -> WorkerSettings:
    return WorkerSettings("http://broker", Path("pkg"), "t", "m", "1", **kw)  # type: ignore[arg-type]


def test_the_workers_vllm_binds_every_cpu_by_default_and_its_binding_is_measured() -> None:
    default = _settings(engine="vllm")
    assert default.vllm_cpu_binding == VllmCpuBinding()
    assert default.measured_config()["engine"]["vllm_cpu_bind"] == "all"
    assert _settings(engine="vllm", vllm_cpu_bind="auto").measured_config() != default.measured_config()
    # our engine's measurement does not name a setting it does not read
    assert "vllm_cpu_bind" not in _settings().measured_config()["engine"]


def test_a_malformed_worker_binding_is_refused_at_settings() -> None:
    with pytest.raises(ValueError, match="vllm_cpu_bind"):
        _settings(engine="vllm", vllm_cpu_bind="0-x")
