"""The control plane's one composition root: `create_app(settings)` builds the gateway's parts
(`build_gateway`: store, limits, admission, registry, catalog, audit, tracing, worker clients, ...)
and one HTTP app with the gateway (OpenAI, sealed and internal routes), the management API
(`/admin/v1`, package uploads) and the web console (`/console`).

The parts do not know each other: the gateway imports neither management nor the console (an
import contract, pyproject.toml); routes of all three get the gateway's parts as typed FastAPI
dependencies (api/gateway/dependencies.py), bound into each route once here (api/parts.py); the
console talks to the key broker only through the broker's admin HTTP API and the contracts in
`protocol.broker`. Nothing is built at import time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.console.router import install as install_console
from api.errors import SealedApiError
from api.gateway import internal
from api.gateway.admission import AdmissionController
from api.gateway.admission_gate import AdmissionGate
from api.gateway.audit import open_gateway_audit
from api.gateway.capacity import AdaptiveCapacity, CapacityPolicy
from api.gateway.catalog import Catalog
from api.gateway.conversations import router as conversations_router
from api.gateway.delivery_probe import DeliveryProbe
from api.gateway.demand import Demand
from api.gateway.dependencies import get_service
from api.gateway.edge import EdgeGuard
from api.gateway.embeddings_routes import router as embeddings_router
from api.gateway.enrolment import Enrolment
from api.gateway.errors import error_handlers
from api.gateway.files_routes import get_retrieval
from api.gateway.files_routes import router as files_router
from api.gateway.grpc_client import WorkerClients
from api.gateway.limits import LocalQueueCounter, QueueCounter, RedisLimiterStore, RedisQueueCounter
from api.gateway.metering import Metering
from api.gateway.metrics import EngineMetrics, Metrics
from api.gateway.registry import WorkerRegistry
from api.gateway.responses_routes import router as responses_router
from api.gateway.responses_store import StoredResponses
from api.gateway.router import router as openai_router
from api.gateway.sealed_retrieval_routes import router as sealed_retrieval_router
from api.gateway.sealed_router import router as sealed_router
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings
from api.gateway.settlement import Settlement
from api.gateway.tickets import Admission
from api.gateway.usage_writer import UsageWriter
from api.gateway.vector_stores import GatewayRetrieval
from api.gateway.vector_stores_routes import router as vector_stores_router
from api.gateway.worker_attestation import load_verifier
from api.management import uploads
from api.management.app import router as management_router
from api.management.lifecycle import router as lifecycle_router
from api.management.metrics import router as metrics_router
from api.management.oidc import OidcVerifier, get_oidc_verifier
from api.management.sessions import router as sessions_router
from api.parts import RouteBinder
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import Store
from policy.audit.edge import EdgeRefusals
from policy.audit.stream.embedded import forwarding_from_env
from policy.limiter import TokenBucketLimiter
from protocol.asgi import without_native_telemetry
from protocol.model_ref import ModelRef
from protocol.tls import load_or_create
from protocol.tracing import tracing_from_env

CONSOLE_COMPONENT = "console"  # the console's audit log (api/console/router.py), in this process


def build_gateway(settings: GatewaySettings, store: Store | None = None) -> GatewayService:
    """Every part of the gateway, built once, from the settings (and the environment: tracing and
    audit forwarding); `store`: an already migrated one (tests), else the settings' database."""
    if store is None:
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
    admission = AdmissionController(limiter, counter, settings.max_inflight, settings.max_queued,
                                    max_request_streams=settings.max_choices)
    audit = open_gateway_audit(settings)
    registry = WorkerRegistry(settings.heartbeat_timeout_s, require_attestation=settings.broker_jwks is not None)
    verifier = (load_verifier(settings.broker_jwks, settings.broker_issuer)
                if settings.broker_jwks is not None else None)
    identity = load_or_create(settings.data_dir / "gateway-client.key", settings.data_dir / "gateway-client.pem")
    metrics = Metrics(lambda: float(admission.running), lambda: float(len(admission.queue)))
    metrics.registry.register(EngineMetrics(lambda: registry.workers.values()))  # vLLM workers' (vllm-backend.md)
    demand, usage_writer = Demand(metrics.registry), UsageWriter(store)
    catalog, metering = Catalog(settings, store, registry), Metering(metrics, usage_writer)
    logs = {audit.component: audit.path.parent}  # the console's log, written in this process, goes too
    if settings.console.audit_dir is not None:
        logs[CONSOLE_COMPONENT] = settings.console.audit_dir
    service = GatewayService(
        settings=settings, store=store, audit=audit, admission=admission, registry=registry, catalog=catalog,
        admissions=Admission(settings, catalog, admission, metrics, audit),
        enrolment=Enrolment(registry, verifier, demand, metrics), clients=WorkerClients(identity),
        # Its own channels (created on the loop that probes): gRPC's path in this process is shared.
        delivery_probe=DeliveryProbe(registry, WorkerClients(identity)), metrics=metrics, demand=demand,
        usage_writer=usage_writer, metering=metering, settlement=Settlement(audit, metering),
        edge_audit=EdgeRefusals(audit), tracing=tracing_from_env("gateway"),
        audit_forwarding=forwarding_from_env(logs), responses=StoredResponses(store, audit))
    if settings.adaptive_lag_s is not None:
        capacity = AdaptiveCapacity(admission.scheduler, admission.dispatch, settings.max_inflight,
                                    CapacityPolicy(target_lag_s=settings.adaptive_lag_s))
        registry.clock.on_tick(capacity.observe)  # the loop clock's ticker measures the lag
        service.delivery_probe.on_delay(capacity.observe_delivery)  # and the probe gRPC's delivery
        service.delivery_probe.busy_when(capacity.sheddable)  # at full rate only while a cut could shed
        metrics.dispatch_slots.set_function(lambda: float(admission.scheduler.capacity))
    for route in settings.workers:
        store.upsert_version(ModelRef(route.tenant, route.model, route.version))
    catalog.bootstrap_keys()
    return service


def create_app(settings: GatewaySettings, service: GatewayService | None = None) -> FastAPI:
    """The control plane's app over the gateway's parts (`service`: built from `settings` if None)."""
    service = service or build_gateway(settings)
    oidc = settings.oidc
    app = _gateway_app(settings, service)
    # The parts, bound into every route once (api/parts.py): routes get them as typed dependencies.
    binder = RouteBinder(app)
    binder.bind(get_service, service)
    binder.bind(get_retrieval, GatewayRetrieval(service))  # files and vector stores (api/gateway/vector_stores.py)
    binder.bind(uploads.package_store, uploads.PackageStore(settings.data_dir / "package-store"))
    binder.bind(get_oidc_verifier, OidcVerifier(oidc) if oidc is not None else None)
    for router in (openai_router, sealed_router, sealed_retrieval_router, responses_router, conversations_router,
                   files_router, vector_stores_router, embeddings_router, internal.router):
        binder.include(router)
    for router in (management_router, lifecycle_router, sessions_router):  # sessions: logout, revocation, removal
        binder.include(router, prefix="/admin/v1")
    binder.include(metrics_router)  # /metrics: management tokens (operator, auditor)
    binder.include(uploads.router)  # package uploads, for tenant admins
    if oidc is None:
        logging.getLogger("api.app").warning(
            "auth: LOCAL DEVELOPMENT MODE - management API and console accept shared-secret HS256 tokens, "
            "no single sign-on; configure --oidc-config for production")
    elif oidc.accept_local_tokens:
        logging.getLogger("api.app").warning(
            "auth: single sign-on, and local HS256 management tokens accepted too (accept_local_tokens)")
    install_console(binder, settings.console, settings.data_dir, sso=oidc is not None and oidc.console_enabled,
                    local_auth=oidc is None or oidc.accept_local_tokens)
    app.add_exception_handler(SealedApiError, opaque_error)  # the more specific handlers above win
    return app


async def opaque_error(request: Request, exc: Exception) -> JSONResponse:
    """The edge of the control plane's error tree (api/errors.py): an error no route answered says
    nothing of itself to the caller; the log names its type only (a message may name a tenant or a path)."""
    logging.getLogger("api.app").error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
    return JSONResponse({"error": {"message": "internal error", "type": "internal_error"}}, status_code=500)


def _gateway_app(settings: GatewaySettings, service: GatewayService) -> FastAPI:
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
    for error, handler in error_handlers(service.edge_audit).items():
        app.add_exception_handler(error, handler)
    # Body limit (chunked bodies included) and undecodable JSON text, before any route runs.
    app.add_middleware(EdgeGuard, max_body_bytes=settings.max_body_bytes, edge=service.edge_audit)
    # Outermost: a key over its own request rate or queue bound is refused before its body is read.
    app.add_middleware(AdmissionGate, service=service)
    return app
