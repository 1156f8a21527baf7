"""The gateway's own app: `build_service(settings)` and `gateway_app(settings, service)`, its
OpenAI, sealed and internal routes, error handlers and edge middleware. It knows nothing of the
management API or the console: `api.app.create_app` composes all three."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.gateway import internal
from api.gateway.admission import AdmissionController
from api.gateway.admission_gate import AdmissionGate
from api.gateway.capacity import AdaptiveCapacity, CapacityPolicy
from api.gateway.conversations import router as conversations_router
from api.gateway.edge import EdgeGuard
from api.gateway.errors import (
    GatewayError,
    gateway_error_handler,
    http_error_handler,
    validation_error_handler,
)
from api.gateway.limits import LocalQueueCounter, QueueCounter, RedisLimiterStore, RedisQueueCounter
from api.gateway.responses_routes import router as responses_router
from api.gateway.router import router
from api.gateway.sealed_router import router as sealed_router
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import Store
from policy.limiter import TokenBucketLimiter
from protocol.asgi import without_native_telemetry
from protocol.model_ref import ModelRef


def build_service(settings: GatewaySettings) -> GatewayService:
    engine = make_engine(settings.db_url)
    upgrade(engine)
    store = Store(session_factory(engine))
    counter: QueueCounter
    if settings.redis_url:
        import redis  # only fleets need it

        client = redis.Redis.from_url(settings.redis_url)
        limiter, counter = TokenBucketLimiter(RedisLimiterStore(client)), RedisQueueCounter(client)
    else:
        limiter, counter = TokenBucketLimiter(), LocalQueueCounter()
    service = GatewayService(settings, store, AdmissionController(limiter, counter, settings.max_inflight,
                                                                  settings.max_queued,
                                                                  max_request_streams=settings.max_choices))
    if settings.adaptive_lag_s is not None:
        admission = service.admission
        capacity = AdaptiveCapacity(admission.scheduler, admission.dispatch, settings.max_inflight,
                                    CapacityPolicy(target_lag_s=settings.adaptive_lag_s))
        service.registry.clock.on_tick(capacity.observe)  # the loop clock's ticker measures the lag
        service.delivery_probe.on_delay(capacity.observe_delivery)  # and the probe gRPC's delivery
        service.metrics.dispatch_slots.set_function(lambda: float(capacity.slots))
    for route in settings.workers:
        store.upsert_version(ModelRef(route.tenant, route.model, route.version))
    service.bootstrap_keys()
    return service


def gateway_app(settings: GatewaySettings, service: GatewayService) -> FastAPI:
    """The gateway's routes over `service`; the composition root adds management and the console."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.registry.clock.start()  # worker liveness on the gateway's own (loop-lag-adjusted) clock
        if settings.adaptive_lag_s is not None:
            service.delivery_probe.start()
        yield
        await service.delivery_probe.stop()
        await service.close()

    # No public /docs, /redoc or /openapi.json: the schema maps the admin surface. `app.openapi()`
    # still builds it (the schema tests use that).
    app = FastAPI(title="Sealed gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  **without_native_telemetry())
    app.state.service = service
    app.include_router(router)
    app.include_router(sealed_router)
    app.include_router(responses_router)
    app.include_router(conversations_router)
    app.include_router(internal.router)
    app.add_exception_handler(GatewayError, gateway_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)

    # Body limit (chunked bodies included) and undecodable JSON text, before any route runs.
    app.add_middleware(EdgeGuard, max_body_bytes=settings.max_body_bytes)
    # Outermost: a key over its own request rate or queue bound is refused before its body is read.
    app.add_middleware(AdmissionGate, service=service)
    return app
