"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.gateway.edge_audit import audit_edge
from protocol.openai.errors import OpenAIError as GatewayError
from protocol.openai.errors import error_body

__all__ = ["GatewayError", "error_body", "error_response", "gateway_error_handler", "http_error_handler",
           "validation_error_handler"]


def error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content=error_body(exc.message, exc.type, exc.code, exc.param),
                        headers=exc.headers)


async def gateway_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    audit_edge(request.scope, exc.status, exc.code)
    return error_response(exc)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    audit_edge(request.scope, 400, "invalid_json" if any(e.get("type") == "json_invalid" for e in errors)
               else "invalid_value")  # a schema error (FastAPI's 422), answered 400 in OpenAI's shape
    if any(e.get("type") == "json_invalid" for e in errors):
        return JSONResponse(status_code=400, content=error_body("request body is not valid JSON",
                                                                "invalid_request_error", "invalid_json"))
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    message = f"invalid request: {param}: {first.get('msg', 'invalid value')}" if param else "invalid request"
    return JSONResponse(status_code=400, content=error_body(message, "invalid_request_error", "invalid_value", param))


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    audit_edge(request.scope, exc.status_code, "not_found" if exc.status_code == 404 else None)
    return JSONResponse(status_code=exc.status_code,
                        content=error_body(str(exc.detail), "invalid_request_error"))
