"""The build of the engine's C++ CPU kernels (everything else about the package is in pyproject.toml).

The kernels are compiled here, when the project is installed, and never inside a worker: the worker
loads the module this builds and refuses one that is missing or stale (docs/engine.md, "Where the
CPU kernels are compiled"). The build needs torch (its headers and libraries) and a C++ compiler,
so it runs without build isolation, after torch is installed:

    pip install torch==2.13.0 && pip install --no-build-isolation -e '.[test]'      (make install)

$SEALED_CPU_KERNELS_MARCH: the instruction set to compile for (default: native).
$SEALED_CPU_KERNELS=skip: install without them (an image that runs no CPU worker: the gateway, the
broker, vLLM's own virtualenv); a CPU worker on such an install refuses to start.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
KERNELS = Path("enclave_worker", "engine", "kernels")


def _cpu_build():  # type: ignore[no-untyped-def]
    # By path: importing the package would run its __init__ files (and torch) before the build.
    spec = importlib.util.spec_from_file_location("_sealed_cpu_build", ROOT / KERNELS / "cpu_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kernel_build() -> dict[str, object]:
    if os.environ.get("SEALED_CPU_KERNELS") == "skip":
        print("sealed: SEALED_CPU_KERNELS=skip: the CPU kernels are not built; a CPU worker on this install "
              "will refuse to start", file=sys.stderr)
        return {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        sys.exit("sealed: building the CPU kernels needs torch installed first and no build isolation: "
                 "pip install torch==2.13.0 && pip install --no-build-isolation -e . "
                 "(or SEALED_CPU_KERNELS=skip for an install that runs no CPU worker)")
    cpu_build = _cpu_build()
    march = os.environ.get("SEALED_CPU_KERNELS_MARCH") or cpu_build.DEFAULT_MARCH
    sources = [(KERNELS / name).as_posix() for name in cpu_build.SOURCE_NAMES]
    record = cpu_build.build_record(cpu_build.read_sources(ROOT / KERNELS), torch.__version__, march)
    extension = CppExtension(
        ".".join([*KERNELS.parts, cpu_build.MODULE_NAME]), sources,
        extra_compile_args=[*cpu_build.cxx_flags(march), f"-DSEALED_BUILD_INFO={cpu_build.encode_record(record)}"],
    )
    return {"ext_modules": [extension], "cmdclass": {"build_ext": _with_digest(cpu_build, BuildExtension)}}


def _with_digest(cpu_build, build_extension):  # type: ignore[no-untyped-def]
    """build_ext that, once each module is complete (in build/ and, editable, in the source tree), writes
    its digest beside it, atomically: a build killed earlier leaves no digest or a stale one, and the
    worker refuses the module (one line) instead of loading a half-written file."""

    class BuildExtensionWithDigest(build_extension.with_options(use_ninja=False)):  # type: ignore[misc]
        def run(self) -> None:
            super().run()
            inplace = self.inplace
            for self.inplace in sorted({False, bool(inplace)}):
                for ext in self.extensions:
                    module = Path(self.get_ext_fullpath(ext.name))
                    digest = module.with_name(cpu_build.DIGEST_NAME)
                    partial = digest.with_name(digest.name + ".partial")
                    partial.write_text(cpu_build.digest_line(module))
                    os.replace(partial, digest)
            self.inplace = inplace

    return BuildExtensionWithDigest


setup(**_kernel_build())
