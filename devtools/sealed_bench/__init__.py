"""Benchmarks shipped with the product: `sealed bench NAME [ARGS]` runs `sealed_bench.bench_NAME`.

Each module exposes `main(argv: list[str] | None = None) -> int` with its own argparse options, so
`sealed bench NAME --help` shows that benchmark's options. The package may import every role (it
drives a whole stack); no role imports it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType

PREFIX = "bench_"


def available() -> list[str]:
    """Benchmark names, found by module name without importing any benchmark."""
    return sorted(m.name.removeprefix(PREFIX) for m in pkgutil.iter_modules(__path__) if m.name.startswith(PREFIX))


class UnknownBenchmarkError(LookupError):
    """No benchmark of that name ships in this package."""


def load(name: str) -> Callable[[list[str]], int]:
    """The `main` of benchmark NAME (`-` and `_` alike: `sealed-path` is `bench_sealed_path`); imported
    through the package so it is registered in sys.modules."""
    name = name.replace("-", "_")
    if name not in available():
        raise UnknownBenchmarkError(f"unknown benchmark {name!r}; available: {', '.join(available())}")
    module: ModuleType = importlib.import_module(f"{__name__}.{PREFIX}{name}")
    main: Callable[[list[str]], int] = module.main
    return main
