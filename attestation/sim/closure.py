"""The import closure of an entry point: the code a simulated measurement covers.

Every module of this project that `python -m <entry point>` can import, found by reading the import
statements of the entry point and then of every project module reached (function-level imports
included, so lazy imports are measured too), plus the `__init__` of every package on the way
(importing `a.b.c` runs `a` and `a.b`), plus every compiled extension module it imports (their
bytes as loaded, so a replaced or rebuilt `.so` changes the measurement like an edited module).
The worker (`enclave_worker.measurement`) and the key broker (`key_broker.measurement`) each
measure their own entry point's closure with this walker.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
from collections.abc import Iterator
from pathlib import Path

# Every top-level package of this distribution; a closure is computed over these.
PROJECT_PACKAGES = ("enclave_worker", "protocol", "attestation", "policy", "key_broker", "api")


class MeasurementError(Exception):
    """The measured code cannot be read or resolved (a missing module file)."""


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


def closure_modules(entry_point: str) -> dict[str, Path]:
    """Module name -> source file for every project module `entry_point` can import."""
    dirs = _package_dirs()
    found: dict[str, Path] = {}
    pending = [entry_point]
    while pending:
        module = pending.pop()
        if module in found or module.split(".")[0] not in dirs:
            continue
        path = _module_file(module, dirs)
        if path is None:
            if module == entry_point:
                raise MeasurementError(f"cannot find the entry point {entry_point}")
            continue  # `from a import name`: a name, not a submodule
        found[module] = path
        parts = module.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        if path.suffix == ".py":  # an extension module's imports are its own business (measured as bytes)
            pending.extend(_imports(module, path))
    return found


def closure_code(entry_point: str) -> dict[str, bytes]:
    """Relative path ("enclave_worker/boot.py", "enclave_worker/engine/kernels/_cpu_ops.<abi>.so")
    -> bytes of every file in the closure of `entry_point`."""
    code = {}
    for module, path in closure_modules(entry_point).items():
        parent = Path(*module.split("."))
        rel = parent / path.name if path.name == "__init__.py" else parent.with_name(path.name)
        code[rel.as_posix()] = path.read_bytes()
    return code
