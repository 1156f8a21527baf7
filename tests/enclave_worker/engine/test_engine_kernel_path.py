"""One kernel path per device, dtype and CPU class, decided from the CPU's features and the
configuration (enclave_worker/engine/kernel_path.py): identical engines give identical logits, the
worker's measured configuration names the path, and a seeded request's tokens do not depend on its
batch, also while another process keeps the cores busy."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from enclave_worker.boot import engine_config
from enclave_worker.engine import EngineConfig, EngineError, LLMEngine, SamplingParams
from enclave_worker.engine.kernel_path import CPU_CLASSES, choose_kernel_path, detect_cpu_class
from enclave_worker.engine.layers.attention import AttentionMetadata, PrefillChunk
from enclave_worker.engine.layers.packed import bf16_native
from enclave_worker.engine.threads import available_cpus
from enclave_worker.settings import WorkerSettings

# (device, dtype, decode_kernels, cpu class) -> (linear, C++ CPU kernels): the rule, whole
RULE = [
    (("cpu", "float32", "auto", "x86-avx512-bf16"), ("panels", True)),
    (("cpu", "float32", "auto", "x86-avx2"), ("panels", True)),
    (("cpu", "float32", "triton", "x86-avx512"), ("panels", True)),
    (("cpu", "float32", "torch", "x86-avx512-bf16"), ("torch", False)),
    (("cpu", "bfloat16", "auto", "x86-avx512-bf16"), ("onednn-packed", True)),
    (("cpu", "bfloat16", "auto", "x86-avx512"), ("torch", True)),
    (("cpu", "bfloat16", "auto", "x86-avx2"), ("torch", True)),
    (("cpu", "float16", "auto", "x86-avx512-bf16"), ("torch", False)),
    (("cpu", "int8", "auto", "x86-avx2"), ("q8-blocks", False)),
    (("cpu", "int8", "auto", "x86-avx512-bf16"), ("q8-blocks", False)),
    (("cuda", "int8", "auto", None), ("int8", False)),
    (("cpu", "int4", "auto", "generic"), ("int4", False)),
    (("cuda", "bfloat16", "auto", None), ("torch", False)),
    (("cuda:1", "fp8", "auto", None), ("fp8", False)),
]


@pytest.mark.parametrize(("args", "want"), RULE)
def test_the_rule_gives_one_path_per_device_dtype_and_cpu_class(args: tuple, want: tuple[str, bool]) -> None:
    path = choose_kernel_path(*args)
    assert (path.linear, path.cpu_kernels) == want
    assert path == choose_kernel_path(*args)  # a function of its inputs alone


def test_the_path_name_says_device_class_dtype_and_kernels() -> None:
    assert choose_kernel_path("cpu", "float32", "auto", "x86-avx2").name == "cpu/x86-avx2/float32/panels+cpp"
    assert choose_kernel_path("cuda", "bfloat16", "auto", None).name == "cuda/bfloat16/torch"
    assert detect_cpu_class() in CPU_CLASSES


@pytest.mark.parametrize("bad", ["avx2", "", "x86-AVX2"])
def test_an_unknown_cpu_class_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cpu_class"):
        choose_kernel_path("cpu", "float32", "auto", bad)
    with pytest.raises(ValueError, match="cpu_class"):
        EngineConfig(cpu_class=bad)


def test_an_engine_refuses_a_cpu_class_this_machine_is_not(make_engine) -> None:
    other = next(c for c in CPU_CLASSES if c != detect_cpu_class())
    with pytest.raises(EngineError, match="CPU class"):
        make_engine(cpu_class=other, kv_cache_memory_bytes=8 << 20)
    eng = make_engine(cpu_class=detect_cpu_class(), kv_cache_memory_bytes=8 << 20)
    assert eng.kernel_path.cpu_class == detect_cpu_class()


def _logits(engine, prompts: list[list[int]]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """One eager prefill step of ``prompts`` (slots in the first blocks), every row's logits."""
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    block, chunks, slots, offset = engine.config.block_size, [], [], 0
    for i, p in enumerate(prompts):
        first = i * (-(-len(p) // block) + 1) * block  # each prompt in its own blocks
        seq_slots = torch.arange(first, first + len(p))
        chunks.append(PrefillChunk(offset, len(p), seq_slots, None))
        slots.append(seq_slots)
        offset += len(p)
    meta = AttentionMetadata(torch.cat(slots), None, None, None, tuple(chunks), False, 0)
    return engine.runner.forward(ids, positions, meta, list(range(len(ids))))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_fresh_engines_with_one_configuration_give_bit_identical_logits(make_engine, h, dtype: str) -> None:
    if dtype == "bfloat16" and not bf16_native():
        pytest.skip("the bf16 packed path needs oneDNN's bf16 on this CPU")
    engines = [make_engine(dtype=dtype, num_threads=2, kv_cache_memory_bytes=8 << 20) for _ in range(2)]
    assert engines[0].kernel_path == engines[1].kernel_path
    prompts = [engines[0].tokenizer.encode(p) for p in h.prompts[:3]]
    first, second = (_logits(e, prompts) for e in engines)
    assert torch.equal(first, second)
    assert not torch.equal(first[0], first[1])  # the comparison sees real, distinct logits


def test_the_measured_configuration_names_the_kernel_path(tmp_path: Path) -> None:
    def settings(**kw: object) -> WorkerSettings:
        return WorkerSettings(broker_url="http://b", package_dir=tmp_path, tenant="t", model="m", version="1",
                              unsafe_no_tenant_policy=True, **kw)  # type: ignore[arg-type]

    avx2 = settings(cpu_class="x86-avx2").measured_config()["engine"]
    assert avx2["kernel"] == "cpu/x86-avx2/float32/panels+cpp"
    bf16 = settings(cpu_class="x86-avx512-bf16", engine_dtype="bfloat16").measured_config()["engine"]
    assert bf16["kernel"] == "cpu/x86-avx512-bf16/bfloat16/onednn-packed+cpp"
    here = settings().measured_config()["engine"]["kernel"]
    assert here == f"cpu/{detect_cpu_class()}/float32/panels+cpp"  # unnamed: this machine's class
    assert settings(device="cuda").measured_config()["engine"]["kernel"] == "cuda/bfloat16/torch"
    assert "kernel" not in settings(engine="vllm").measured_config()["engine"]
    with pytest.raises(ValueError, match="cpu_class"):
        settings(cpu_class="avx2")
    # the engine the worker builds is held to the measured class (it refuses another: test above)
    assert engine_config(settings(cpu_class="x86-avx2")).cpu_class == "x86-avx2"


def test_the_worker_cli_resolves_and_measures_the_cpu_class(tmp_path: Path) -> None:
    from enclave_worker.cli import parse

    base = ["--broker-url", "http://b", "--package-dir", str(tmp_path), "--tenant", "t", "--model", "m",
            "--version", "1", "--grpc-port", "9000", "--unsafe-no-tenant-policy"]
    assert parse(base)[1].cpu_class == detect_cpu_class()
    named = parse([*base, "--cpu-class", "x86-avx2"])[1]
    assert named.cpu_class == "x86-avx2" and named.measured_config()["engine"]["kernel"].startswith("cpu/x86-avx2/")
    with pytest.raises(SystemExit):
        parse([*base, "--cpu-class", "pentium"])


BUSY_LOOP = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def every_core_busy() -> Iterator[None]:
    """A bounded busy loop in another process per CPU this process may use, for the whole block."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(available_cpus())]
    try:
        time.sleep(0.2)  # the loops are running before the first step
        assert all(p.poll() is None for p in busy)
        yield
        assert all(p.poll() is None for p in busy)  # the load lasted the whole run
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_two_engines_built_from_one_worker_configuration_agree_to_the_bit_under_load(checkpoint, h,
                                                                                   tmp_path: Path) -> None:
    """What a worker builds from its measured settings (a `sealed tune` thread count), twice: one engine's
    logits on a quiet machine are the other's, to the bit, while every core is busy."""
    settings = WorkerSettings(broker_url="http://b", package_dir=tmp_path, tenant="t", model="m", version="1",
                              unsafe_no_tenant_policy=True, num_threads=2)
    config = dataclasses.replace(engine_config(settings), kv_cache_memory_bytes=8 << 20)
    engines = [LLMEngine.from_checkpoint(dataclasses.replace(
        checkpoint, tensors={k: v.clone() for k, v in checkpoint.tensors.items()}), config) for _ in range(2)]
    assert engines[0].kernel_path.name == engines[1].kernel_path.name == settings.kernel_path
    prompts = [engines[0].tokenizer.encode(p) for p in h.prompts[:4]]
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(config.num_threads or 1)  # as the engine's own steps run (model_runner.py)
    try:
        quiet = _logits(engines[0], prompts)
        with every_core_busy():
            busy = _logits(engines[1], prompts)
    finally:
        torch.set_num_threads(caller_threads)
    assert torch.equal(quiet, busy)
    assert not torch.equal(quiet[0], quiet[1])  # the comparison sees real, distinct logits


def test_a_seeded_request_gives_the_same_tokens_alone_and_batched_under_load(make_engine, h) -> None:
    """The failure issue 47 saw: alone and batched differed on a busy machine, where a live tuner moved
    the thread count. A bounded busy loop in another process per CPU keeps the cores busy meanwhile."""
    eng = make_engine(num_threads=2, kv_cache_memory_bytes=16 << 20)
    prompt = eng.tokenizer.encode("Write a poem about autumn:")
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    others = [(f"o{i}", eng.tokenizer.encode(p), params) for i, p in enumerate(h.prompts[:3])]
    quiet = h.tokens_of(h.run_sync(eng, [("a", prompt, params)])["a"])
    with every_core_busy():
        alone = h.tokens_of(h.run_sync(eng, [("b", prompt, params)])["b"])
        batched = h.run_sync(eng, [("c", prompt, params), *others])
    assert alone == quiet
    assert h.tokens_of(batched["c"]) == quiet
    assert len(quiet) == 12
