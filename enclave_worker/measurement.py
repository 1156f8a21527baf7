"""The simulated measurement of a worker: the code it runs and its measured configuration.

The code is the worker's import closure: every module of this project that `python -m
enclave_worker` can import, found by reading the import statements of its entry point and then of
every project module reached (function-level imports included, so lazy imports are measured too),
plus the `__init__` of every package on the way (importing `a.b.c` runs `a` and `a.b`), plus every
compiled extension module it imports (the engine's CPU kernels, built at install time: their bytes
as loaded, so a replaced or rebuilt `.so` changes the measurement like an edited module). Editing a
module the worker can run changes the measurement; editing one it cannot run (the key broker, the
gateway, the tenant's package writer) does not. The import rules in pyproject.toml keep the closure
inside `enclave_worker`, `protocol`, `attestation` and `policy`; `docs/architecture.md` says why.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attestation.sim import worker_measurement

ENTRY_POINT = "enclave_worker.__main__"
# Every top-level package of this distribution; the worker's closure is computed over these.
PROJECT_PACKAGES = ("enclave_worker", "protocol", "attestation", "policy", "key_broker", "api")


class MeasurementError(Exception):
    """The worker's code cannot be read or resolved (a missing module file)."""


def _package_dirs() -> dict[str, Path]:
    dirs = {}
    for name in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(name)  # a top-level lookup: imports nothing
        if spec is not None and spec.submodule_search_locations:
            dirs[name] = Path(next(iter(spec.submodule_search_locations)))
    return dirs


def _module_file(module: str, dirs: dict[str, Path]) -> Path | None:
    """The file the import system would load for `module`: a package's __init__.py, then, as Python's
    own finder orders them, an extension module (this interpreter's suffixes), then a source file."""
    top, *rest = module.split(".")
    if top not in dirs:
        return None
    base = dirs[top].joinpath(*rest)
    extensions = [base.with_name(base.name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    for candidate in (base / "__init__.py", *extensions, base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every module name an import statement in `path` may load (names, not resolved files)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target
            # `from a import b` loads the submodule a.b when b is one.
            yield from (f"{target}.{alias.name}" for alias in node.names if alias.name != "*")


def worker_modules() -> dict[str, Path]:
    """Module name -> source file for every project module the worker's entry point can import."""
    dirs = _package_dirs()
    found: dict[str, Path] = {}
    pending = [ENTRY_POINT]
    while pending:
        module = pending.pop()
        if module in found or module.split(".")[0] not in dirs:
            continue
        path = _module_file(module, dirs)
        if path is None:
            if module == ENTRY_POINT:
                raise MeasurementError(f"cannot find the worker's entry point {ENTRY_POINT}")
            continue  # `from a import name`: a name, not a submodule
        found[module] = path
        parts = module.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        if path.suffix == ".py":  # an extension module's imports are its own business (measured as bytes)
            pending.extend(_imports(module, path))
    return found


def measured_code() -> dict[str, bytes]:
    """Relative path ("enclave_worker/boot.py", "enclave_worker/engine/kernels/_cpu_ops.<abi>.so")
    -> bytes of every file in the worker's closure."""
    code = {}
    for module, path in worker_modules().items():
        parent = Path(*module.split("."))
        rel = parent / path.name if path.name == "__init__.py" else parent.with_name(path.name)
        code[rel.as_posix()] = path.read_bytes()
    return code


def simulated_measurement(measured_config: dict[str, Any]) -> bytes:
    return worker_measurement(measured_code(), measured_config)
