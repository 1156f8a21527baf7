"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from protocol.openai.errors import OpenAIError as GatewayError
from protocol.openai.errors import error_body

__all__ = ["GatewayError", "error_body", "gateway_error_handler", "http_error_handler", "validation_error_handler"]


async def gateway_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return JSONResponse(status_code=exc.status, content=error_body(exc.message, exc.type, exc.code, exc.param),
                        headers=exc.headers)


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return JSONResponse(status_code=400, content=error_body("request body is not valid JSON",
                                                                "invalid_request_error", "invalid_json"))
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    message = f"invalid request: {param}: {first.get('msg', 'invalid value')}" if param else "invalid request"
    return JSONResponse(status_code=400, content=error_body(message, "invalid_request_error", "invalid_value", param))


async def http_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(status_code=exc.status_code,
                        content=error_body(str(exc.detail), "invalid_request_error"))
