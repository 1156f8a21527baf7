"""`sealed proxy --upstream URL`: a local OpenAI-compatible endpoint that seals every request.

For curl, LangChain, `vllm bench serve` or any client that speaks the OpenAI API: point it at the
proxy; the proxy verifies the deployment, seals each chat and completion request to the attested
worker, opens and checks each answer (receipt in the `Sealed-Receipt` header when not streamed)
and refuses anything else it cannot seal (400, code `UnsealedRequest`; only the model list passes
through) unless started with `--unsafe-allow-plaintext`. `GET /healthz` is the proxy's own, answered
locally (benchmarks and supervisors wait on it). The API key is the caller's own (its Authorization header).
Runs on the caller's machine: the plaintext never leaves it unsealed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from attestation.errors import AttestationError
from protocol.sealed import SealedError
from sealed_client.errors import UnsealedRequest
from sealed_client.session import SealedSession
from sealed_client.transport import AsyncSealedTransport
from sealed_client.trust import ClientTrust

_HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}


def create_proxy_app(upstream: str, trust: ClientTrust, inner: httpx2.AsyncBaseTransport | None = None,
                     *, unsafe_allow_plaintext: bool = False, retrieval_model: str | None = None) -> Starlette:
    """`retrieval_model`: the embedding model whose worker seals file uploads and vector store searches."""
    session = SealedSession(trust, retrieval_model=retrieval_model)
    upstream = upstream.rstrip("/")
    gateway = upstream[: -len("/v1")] if upstream.endswith("/v1") else upstream
    client = httpx2.AsyncClient(transport=AsyncSealedTransport(session, gateway, inner,
                                                               unsafe_allow_plaintext=unsafe_allow_plaintext),
                                timeout=600.0)

    async def forward(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        out = client.build_request(request.method, gateway + request.url.path, params=request.query_params,
                                   headers=headers, content=await request.body())
        try:
            response = await client.send(out, stream=True)
        except UnsealedRequest as exc:
            # The caller's request itself cannot be sealed (another endpoint): nothing was sent.
            return JSONResponse(status_code=400, content={"error": {
                "message": f"sealed proxy refused: {exc}", "type": "sealed_error", "param": None,
                "code": type(exc).__name__}})
        except (SealedError, AttestationError) as exc:
            # Nothing was served: say why, in OpenAI's error shape, with a status that is not a success.
            return JSONResponse(status_code=502, content={"error": {
                "message": f"sealed proxy refused: {type(exc).__name__}: {exc}", "type": "sealed_error",
                "param": None, "code": type(exc).__name__}})
        keep = {k: v for k, v in response.headers.items() if k.lower() not in _HOP}
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            content = await response.aread()  # a whole JSON answer, already opened and checked
            await response.aclose()
            return Response(content, status_code=response.status_code, headers=keep)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()

        return StreamingResponse(body(), status_code=response.status_code, headers=keep)

    async def healthz(_: Request) -> Response:
        # The proxy's own liveness, answered here and never forwarded: it says the proxy runs, nothing
        # of the deployment (a caller that wants that verifies it: `sealed verify`).
        return JSONResponse({"status": "ok", "proxy": "sealed"})

    app = Starlette(routes=[Route("/healthz", healthz, methods=["GET"]),
                            Route("/{path:path}", forward, methods=["GET", "POST", "DELETE"])])
    app.state.session = session
    return app
