"""The worker's internal HTTP app (gateway and probes -> worker): status, readiness, attestation.

A view over `WorkerState` and nothing more: the process's entry point (`enclave_worker/serve.py`)
boots the worker and runs this app beside the gRPC service; the app starts and stops nothing.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from enclave_worker.standby import Standby
from enclave_worker.state import WorkerState
from protocol.asgi import without_native_telemetry
from protocol.worker_status import WorkerStatus


def _error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": type_}})


def create_app(state: WorkerState, standby: Standby | None = None) -> FastAPI:
    """``standby``: a warm worker's gate, whose /internal/assign starts its boot."""
    app = FastAPI(title="Sealed worker (internal)", docs_url=None, redoc_url=None, **without_native_telemetry())
    if standby is not None:
        app.include_router(standby.router(state))

    @app.get("/internal/status")
    def status() -> WorkerStatus:
        return state.report()

    @app.get("/internal/readyz")
    def readyz() -> JSONResponse:
        """For a pod's readiness probe: 200 only while the model is loaded and serving."""
        live = state.live
        return JSONResponse(status_code=200 if live.status == "ready" else 503,
                            content={"status": live.status, "reason": live.reason})

    @app.get("/internal/attestation")
    def attestation() -> JSONResponse:
        booted = state.live.booted
        if booted is None:
            return _error(503, "model unavailable", "unavailable")
        released = booted.released
        return JSONResponse({"tee": state.settings.tee, "insecure": state.settings.insecure,
                             "evidence": released.bundle.to_json(), "token": released.token,
                             "model_digest": booted.model_digest,
                             "sealed_key_id": state.serving_key.key_id,
                             "promises": state.promises()})

    return app
