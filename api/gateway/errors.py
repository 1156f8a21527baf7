"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}, and the app's handlers,
which audit every refusal answered at the edge (401, 403, 404, 405, 413, schema errors) into the
aggregate, flood-proof `EdgeRefusals` that `create_app` binds them to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from policy.audit.edge import EdgeRefusals
from protocol.openai.errors import OpenAIError as GatewayError
from protocol.openai.errors import error_body

__all__ = ["GatewayError", "audit_edge", "error_body", "error_handlers", "error_response"]
Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


def error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content=error_body(exc.message, exc.type, exc.code, exc.param),
                        headers=exc.headers)


def audit_edge(edge: EdgeRefusals, scope: Mapping[str, Any], status: int, code: str | None) -> None:
    """The answer goes out even if the audit log refuses the write (a tampered log stops the gateway's
    decisions, not its error replies): `refused` logs, never raises, a failed write."""
    edge.refused(scope, status, code, tenant=(scope.get("state") or {}).get("audit_tenant"))


def error_handlers(edge: EdgeRefusals) -> dict[type[Exception], Handler]:
    """The app's exception handlers, each auditing its refusal into `edge`."""

    async def gateway_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GatewayError)
        audit_edge(edge, request.scope, exc.status, exc.code)
        return error_response(exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        invalid_json = any(e.get("type") == "json_invalid" for e in errors)
        # A schema error (FastAPI's 422) is answered 400 in OpenAI's shape.
        audit_edge(edge, request.scope, 400, "invalid_json" if invalid_json else "invalid_value")
        if invalid_json:
            return JSONResponse(status_code=400, content=error_body("request body is not valid JSON",
                                                                    "invalid_request_error", "invalid_json"))
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"invalid request: {param}: {first.get('msg', 'invalid value')}" if param else "invalid request"
        return JSONResponse(status_code=400, content=error_body(message, "invalid_request_error", "invalid_value",
                                                                param))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        audit_edge(edge, request.scope, exc.status_code, "not_found" if exc.status_code == 404 else None)
        return JSONResponse(status_code=exc.status_code, content=error_body(str(exc.detail), "invalid_request_error"))

    return {GatewayError: gateway_error, RequestValidationError: validation_error,
            StarletteHTTPException: http_error}
