"""The package import rules (pyproject.toml [tool.importlinter]) hold, so `make test` fails on a
violation. docs/architecture.md draws the same rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# In a child process: import-linter's CLI reconfigures logging (disabling loggers that exist), which
# would silence other tests' log capture in this session.
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))")


def test_import_contracts_hold() -> None:
    run = subprocess.run([sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 broken" in run.stdout, run.stdout


# Each contract added for issue #34, broken on purpose in a scratch copy of the tree: a scratch
# import (appended to one module) makes lint-imports fail, naming that contract. A contract that
# such an import did not break would be a contract that cannot fail.
PRODUCT = ("enclave_worker", "key_broker", "api", "attestation", "policy", "protocol", "sealed_client")
DEVTOOLS = ("sealed_bench", "sealed_fakes")  # the development packages, in devtools/ (not the product's wheel)
NO_DEVTOOLS = "The product never imports the development packages (benchmarks, hardware fakes)"
SCRATCH = {
    "protocol-imports-attestation": ("protocol/model_ref.py", "import attestation.bundle",
                                     "Contracts (protocol) import neither attestation nor policy"),
    "protocol-imports-policy": ("protocol/fsutil.py", "import policy.decision",
                                "Contracts (protocol) import neither attestation nor policy"),
    "api-imports-sealed_bench": ("api/home.py", "import sealed_bench.cli", NO_DEVTOOLS),
    "worker-imports-sealed_fakes": ("enclave_worker/boot.py", "import sealed_fakes.fake_tsm", NO_DEVTOOLS),
    "attestation-imports-sealed_fakes": ("attestation/sim/__init__.py", "import sealed_fakes.snp_pki", NO_DEVTOOLS),
    "gateway-imports-management": ("api/gateway/registry.py", "import api.management.auth",
                                   "The gateway imports neither management nor the console nor the key broker"),
    "gateway-imports-key_broker": ("api/gateway/catalog.py", "import key_broker.receipts",
                                   "The gateway imports neither management nor the console nor the key broker"),
    "console-imports-key_broker": ("api/console/views.py", "import key_broker.receipts",
                                   "The console talks to the key broker only over its HTTP API (protocol.broker)"),
    "circle-stack-orchestrator": ("api/orchestrator/local.py", "import api.stack",
                                  "No import circles inside a package"),
    "circle-policy-compile": ("policy/compile.py", "import policy.policyset", "No import circles inside a package"),
    "circle-policy-errors": ("policy/errors.py", "import policy.decision", "No import circles inside a package"),
    "circle-bench-serve": ("sealed_bench/serve_load.py", "import sealed_bench.bench_serve",
                           "No import circles inside a package"),
    "circle-attestation-tdx-pcs": ("attestation/tdx/verify.py", "import attestation.tdx.cli",
                                   "No import circles inside a package"),
    "circle-worker-vllm-settings": ("enclave_worker/vllm_cpu_binding.py", "import enclave_worker.vllm_engine.build",
                                    "No import circles inside a package"),
}


@pytest.fixture(scope="module")
def scratch_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product and development packages and pyproject.toml, copied once, side by side on one path
    (tests/ as an empty package)."""
    root = tmp_path_factory.mktemp("tree")
    for package in PRODUCT:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for package in DEVTOOLS:
        shutil.copytree(ROOT / "devtools" / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT, str(root / "pyproject.toml")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("case", sorted(SCRATCH))
def test_a_scratch_import_breaks_its_contract(scratch_tree: Path, case: str) -> None:
    path, line, contract = SCRATCH[case]
    module = scratch_tree / path
    original = module.read_text()
    module.write_text(original + f"\n{line}  # scratch import\n")
    try:
        run = _lint(scratch_tree)
    finally:
        module.write_text(original)
    assert run.returncode != 0, run.stdout
    assert f"{contract} BROKEN" in run.stdout, run.stdout


def test_the_scratch_tree_itself_keeps_every_contract(scratch_tree: Path) -> None:
    """So each failure above is the scratch import's, not the copy's."""
    run = _lint(scratch_tree)
    assert run.returncode == 0, run.stdout + run.stderr
