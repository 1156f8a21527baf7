"""create_app(settings) for the gateway; nothing is built at import time."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.gateway.errors import (
    GatewayError,
    error_body,
    gateway_error_handler,
    http_error_handler,
    validation_error_handler,
)
from api.gateway.keys import ApiKeyStore
from api.gateway.router import router
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings


def create_app(settings: GatewaySettings) -> FastAPI:
    service = GatewayService(settings, ApiKeyStore(settings.data_dir / "api-keys.json"),
                             httpx.AsyncClient(limits=httpx.Limits(max_connections=1024)))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await service.close()

    app = FastAPI(title="Sealed gateway", lifespan=lifespan)
    app.state.service = service
    app.include_router(router)
    app.add_exception_handler(GatewayError, gateway_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
            return JSONResponse(status_code=413, content=error_body("request body too large",
                                                                    "invalid_request_error"))
        return await call_next(request)

    return app
