"""The CPU kernels are compiled when the project is installed, never in a worker (kernels/cpu_build.py,
setup.py): a worker loads the installed build, compiles nothing, survives a kill at any point of its
first boot, and refuses a missing, truncated or stale build in one line with a non-zero exit.

The subprocesses run under a bounded wait (a timeout that fails the test), never a timed assertion."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from enclave_worker.engine.errors import CpuKernelsUnavailable
from enclave_worker.engine.kernels import cpu_build, cpu_ops

ROOT = Path(__file__).resolve().parents[3]
KERNELS = Path("enclave_worker", "engine", "kernels")
BOOT_TIMEOUT_S = 600  # a bound on a hang, far above a boot (~20 s on a loaded 2-vCPU runner)

# A worker's first boot on the CPU, as the worker does it: build the engine (which loads the CPU
# kernels) on the default model, then serve one greedy request through them. Markers on stdout say
# how far it got; the last line says whether torch's run-time C++ builder was ever imported.
BOOT = r"""
import sys
print("start", flush=True)
from enclave_worker.engine import EngineConfig, LLMEngine, SamplingParams, load_gguf
from enclave_worker.engine.checkpoint import default_gguf_path
engine = LLMEngine.from_checkpoint(load_gguf(default_gguf_path()),
                                   EngineConfig(max_num_seqs=2, kv_cache_memory_bytes=8 << 20, num_threads=1))
assert engine.model.cpu_kernels and engine.runner.cpu_kernel, "not on the CPU kernels"
print("engine built", flush=True)
outs = []
engine.add_request("r", engine.tokenizer.encode("Hello"),
                   SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), outs.append, b"")
while engine.has_unfinished_requests():
    engine.step()
assert sum(len(o.delta_token_ids) for o in outs) == 2
print("served", flush=True)
print("cpp_extension imported:", "torch.utils.cpp_extension" in sys.modules, flush=True)
"""


@pytest.fixture(scope="module")
def default_model() -> None:
    from enclave_worker.engine.checkpoint import default_gguf_path

    try:
        if not default_gguf_path().is_file():
            pytest.skip("default model not installed")
    except Exception as exc:
        pytest.skip(f"default model not installed: {exc}")


def _no_compiler_env(tmp_path: Path, pythonpath: Path = ROOT) -> dict[str, str]:
    """PATH holds only this interpreter (no c++, g++, gcc, ninja); torch's extension cache is empty."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(sys.executable)
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir(exist_ok=True)
    return {**os.environ, "PATH": str(bin_dir), "PYTHONPATH": str(pythonpath), "TORCH_EXTENSIONS_DIR": str(extensions),
            "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc"}


def _boot(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", BOOT], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _boot_to_end(env: dict[str, str]) -> str:
    try:
        run = subprocess.run([sys.executable, "-c", BOOT], cwd=ROOT, env=env, text=True, capture_output=True,
                             timeout=BOOT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a worker boot hung (no answer in {BOOT_TIMEOUT_S} s): {exc.stdout!r}")
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_a_boot_serves_on_the_installed_kernels_and_compiles_nothing(tmp_path: Path, default_model: None) -> None:
    env = _no_compiler_env(tmp_path)
    out = _boot_to_end(env)
    assert out.splitlines()[-2:] == ["served", "cpp_extension imported: False"]
    assert not any(Path(env["TORCH_EXTENSIONS_DIR"]).iterdir())  # nothing built, nothing cached, no lock


def test_a_worker_killed_anywhere_in_its_first_boot_leaves_the_next_one_serving(
        tmp_path: Path, default_model: None) -> None:
    """SIGKILL at each point of a first boot (before the engine, while it builds and loads the kernels,
    once it is built); each next boot gets past the point its predecessor was killed at, and
    the last one serves. Under the old run-time build the kill inside the build left torch's lock
    file behind and the next boot waited on it forever (here: the bounded wait fails the test)."""
    env = _no_compiler_env(tmp_path)
    # A lock file where a run-time build would have left one: the worker must not look there at all.
    (Path(env["TORCH_EXTENSIONS_DIR"]) / "sealed_cpu_ops" / "lock").parent.mkdir()
    (Path(env["TORCH_EXTENSIONS_DIR"]) / "sealed_cpu_ops" / "lock").touch()
    for kill_at in ("start", "while building the engine", "engine built"):
        proc = _boot(env)
        assert proc.stdout is not None
        watchdog = threading.Timer(BOOT_TIMEOUT_S, proc.kill)  # bounds the read below if the boot hangs
        watchdog.start()
        try:
            marker = "start" if kill_at == "while building the engine" else kill_at
            for line in proc.stdout:
                if line.strip() == marker:
                    break
            else:
                pytest.fail(f"the boot ended or hung before {kill_at!r}")
            if kill_at == "while building the engine":
                # Kill while the engine is being built (kernels loading), or as soon after as it says so.
                with pytest.raises(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.5)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=BOOT_TIMEOUT_S) == -signal.SIGKILL
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
    assert _boot_to_end(env).splitlines()[-2:] == ["served", "cpp_extension imported: False"]


def _copy_of_the_worker(tmp_path: Path) -> Path:
    """The worker's packages copied, with the kernel build made by the installer, to break one of them."""
    tree = tmp_path / "tree"
    for package in ("enclave_worker", "protocol", "attestation", "policy"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _built_module(tree: Path) -> Path:
    installed = Path(cpu_ops.load_cpu_ops().__file__ or "")
    return tree / KERNELS / installed.name


def _run_worker(tree: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The real worker entry point, up to where it would attest (it exits before, or the test fails)."""
    argv = ["-m", "enclave_worker", "--broker-url", "http://127.0.0.1:9", "--package-dir", str(tmp_path),
            "--tenant", "acme", "--model", "m", "--version", "v1", "--grpc-port", "0", "--port", "0"]
    try:
        return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=_no_compiler_env(tmp_path, tree),
                              text=True, capture_output=True, timeout=BOOT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the worker did not stop on a broken kernel build: {exc.stderr!r}")


def _break_missing(module: Path) -> None:
    module.unlink()


def _break_truncated(module: Path) -> None:  # what a build killed while copying its output leaves
    data = module.read_bytes()
    module.write_bytes(data[: len(data) // 2])


def _break_no_digest(module: Path) -> None:  # killed after the module was written, before its digest
    module.with_name(cpu_build.DIGEST_NAME).unlink()


def _break_stale(module: Path) -> None:  # the source changed after the build (a pull without a reinstall)
    source = module.with_name(cpu_build.SOURCE_NAME)
    source.write_text(source.read_text() + "\n// edited after the build\n")


@pytest.mark.parametrize(("breakage", "says"), [
    (_break_missing, "not built (no _cpu_ops"),
    (_break_truncated, "build is incomplete or altered"),
    (_break_no_digest, "build is incomplete or altered"),
    (_break_stale, "stale: built with another source_sha256"),
])
def test_a_missing_or_stale_build_stops_the_worker_in_one_line(tmp_path: Path, breakage, says: str) -> None:  # type: ignore[no-untyped-def]
    tree = _copy_of_the_worker(tmp_path)
    breakage(_built_module(tree))
    run = _run_worker(tree, tmp_path)
    assert run.returncode == 3, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worker: the CPU kernel") and says in lines[0], run.stderr
    assert "make install" in lines[0]


def test_the_intact_copy_passes_the_check(tmp_path: Path) -> None:
    """The copy above is loadable as it is: what breaks it is the breakage, not the copying."""
    tree = _copy_of_the_worker(tmp_path)
    probe = "from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops; print(load_cpu_ops().__file__)"
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=_no_compiler_env(tmp_path, tree),
                         text=True, capture_output=True, timeout=BOOT_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(_built_module(tree))


@pytest.fixture
def fresh_load():  # type: ignore[no-untyped-def]
    cpu_ops.load_cpu_ops.cache_clear()
    yield cpu_ops.load_cpu_ops
    cpu_ops.load_cpu_ops.cache_clear()


def test_a_build_for_another_torch_is_stale(fresh_load, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(torch, "__version__", "2.0.0+other")
    with pytest.raises(CpuKernelsUnavailable, match="stale: built with another torch"):
        fresh_load()


def test_a_native_build_on_another_cpu_is_stale(fresh_load, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    built = cpu_build.decode_record(fresh_load().build_info())
    if built["march"] != "native":
        pytest.skip("this build names its instruction set; it does not depend on the build machine's CPU")
    fresh_load.cache_clear()
    monkeypatch.setattr(cpu_build, "cpu_flags_digest", lambda: "0" * 64)
    with pytest.raises(CpuKernelsUnavailable, match="stale: built with another cpu_flags_sha256"):
        fresh_load()


def test_the_build_record_is_what_the_worker_recomputes(fresh_load) -> None:  # type: ignore[no-untyped-def]
    module = fresh_load()
    built = cpu_build.decode_record(module.build_info())
    source = cpu_build.read_sources(Path(cpu_ops.__file__).parent)
    assert built == cpu_build.build_record(source, torch.__version__, str(built["march"]))
    assert Path(module.__file__).parent == Path(cpu_ops.__file__).parent  # the package's own build, no cache
