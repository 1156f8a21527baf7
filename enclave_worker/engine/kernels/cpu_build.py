"""What a build of the CPU kernels (cpu_ops.cpp, cpu_linear.cpp, cpu_q8.cpp) is made from, shared by the build
and the worker.

The kernels are compiled when the project is installed (setup.py, a torch CppExtension), never at
run time. The build writes the finished module's digest beside it (`DIGEST_NAME`), and embeds a
record of what it was made from (`build_record`: the sources' SHA-256, the compiler flags, torch's
version, and for `-march=native` a digest of the build machine's CPU flags); the worker checks both
(`cpu_ops.load_cpu_ops`) and refuses a module half written by a killed build, or built from another
source, for another torch or for another CPU.

Standard library only: setup.py loads this file by path, before anything else of the package.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

SOURCE_NAME = "cpu_ops.cpp"  # the module's own file (its bindings); SOURCE_NAMES: every file compiled into it
SOURCE_NAMES = (SOURCE_NAME, "cpu_linear.cpp", "cpu_q8.cpp")
MODULE_NAME = "_cpu_ops"  # enclave_worker.engine.kernels._cpu_ops
# Written beside the module once it is complete (setup.py): the module's SHA-256 and file name. A build
# killed before or while the module was written leaves none, or one that does not match: the worker
# checks it before the module is loaded (a truncated shared object may load and fault later).
DIGEST_NAME = "_cpu_ops.sha256"
# The instruction set the build targets ($SEALED_CPU_KERNELS_MARCH at build time): "native" for the
# machine that builds and runs (make install); an image built on one machine for others names a
# baseline instead (deploy/docker/Dockerfile.worker: x86-64-v3).
DEFAULT_MARCH = "native"
# -fopenmp at compile time only: at::parallel_for's OpenMP pragmas then run on the OpenMP runtime
# torch itself loaded (the symbols resolve through libtorch's own libgomp; nothing links a second one).
BASE_FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")


def cxx_flags(march: str) -> list[str]:
    return [BASE_FLAGS[0], f"-march={march}", *BASE_FLAGS[1:]]


def digest_line(module: Path) -> str:
    return f"{hashlib.sha256(module.read_bytes()).hexdigest()}  {module.name}\n"


def cpu_flags_digest() -> str:
    """SHA-256 of this CPU's feature flags (/proc/cpuinfo): what a -march=native build depends on."""
    flags = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return hashlib.sha256(flags.encode()).hexdigest()


def read_sources(directory: Path) -> bytes:
    """Every source of the module, each named and length-prefixed (a byte moved between two files
    changes the digest too): what `build_record`'s source digest is taken over."""
    parts = []
    for name in SOURCE_NAMES:
        data = (directory / name).read_bytes()
        parts.append(f"{name}\0{len(data)}\0".encode() + data)
    return b"".join(parts)


def build_record(source: bytes, torch_version: str, march: str) -> dict[str, object]:
    """What a build is made from; the worker recomputes it and compares (field by field, to say what differs)."""
    return {
        "source_sha256": hashlib.sha256(source).hexdigest(),
        "flags": cxx_flags(march),
        "torch": torch_version,
        "march": march,
        "cpu_flags_sha256": cpu_flags_digest() if march == "native" else None,
    }


def encode_record(record: dict[str, object]) -> str:
    """Hex of the canonical JSON: a macro value that survives any compiler command line unquoted."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode().hex()


def decode_record(encoded: str) -> dict[str, object]:
    record = json.loads(bytes.fromhex(encoded))
    if not isinstance(record, dict):
        raise ValueError("a build record is a JSON object")
    return record
