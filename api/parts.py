"""The app's parts, bound into its routes once, when `create_app` composes it.

Routes declare a part as a typed dependency on a placeholder (`Depends(get_service)`,
api/gateway/dependencies.py); the placeholder alone fails closed ("no gateway bound"). `RouteBinder`
adds a router's routes to one app with each placeholder, wherever it sits in a route's dependency
graph, replaced by that app's part. FastAPI builds each route's graph once, here; nothing is kept on
`app.state` and `app.dependency_overrides` stays empty: FastAPI rebuilds every route's whole graph
on every request while any override is set (0.2 to 0.7 ms a request, docs/benchmarks.md
"Gateway's fixed cost").

How: a dependency (or endpoint) whose graph reaches a placeholder is copied, per app, with its
signature's `Depends` pointing at the copies; the copy runs the same code object (so a generator or
coroutine function stays one) and is made once per app, so FastAPI's per-request cache still calls
a shared dependency (the caller's key) once. Dependencies that reach no placeholder are used as they are.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, get_args, get_origin

from fastapi import FastAPI, params
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIRouter


class Part:
    """A bound part: the dependency that answers `value` in the place of `placeholder`."""

    def __init__(self, placeholder: Callable[..., Any], value: Any) -> None:
        self.placeholder, self.value = placeholder, value

    async def __call__(self) -> Any:
        return self.value


class RouteBinder:
    """Adds routers' routes to `app` with the parts bound so far (`bind`) in their placeholders' place;
    `replace` puts another dependency in one's place (tests and tools: a caller without the
    management API's sign-in). A placeholder bound after a route was included stays unbound there."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._replacements: dict[Callable[..., Any], Callable[..., Any]] = {}
        self._copies: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # id -> (original, copy)

    def bind(self, placeholder: Callable[..., Any], value: Any) -> None:
        self.replace(placeholder, Part(placeholder, value))

    def replace(self, dependency: Callable[..., Any], by: Callable[..., Any]) -> None:
        self._replacements[dependency] = by
        self._copies.clear()  # a dependency found to reach no bound part may reach this one

    def include(self, router: APIRouter, prefix: str = "") -> None:
        for route in router.routes:
            if not isinstance(route, APIRoute):  # nested routers' routes would keep their placeholders
                raise TypeError(f"{type(route).__name__} in a bound router: include its routers one by one")
            self.app.router.add_api_route(
                prefix + route.path, self._call(route.endpoint), methods=sorted(route.methods or ()),
                name=route.name, status_code=route.status_code, response_model=route.response_model,
                tags=list(route.tags), dependencies=[self._depends(d) for d in route.dependencies],
                summary=route.summary, description=route.description,
                response_description=route.response_description, responses=dict(route.responses),
                deprecated=route.deprecated, operation_id=route.operation_id,
                response_model_include=route.response_model_include,
                response_model_exclude=route.response_model_exclude,
                response_model_by_alias=route.response_model_by_alias,
                response_model_exclude_unset=route.response_model_exclude_unset,
                response_model_exclude_defaults=route.response_model_exclude_defaults,
                response_model_exclude_none=route.response_model_exclude_none,
                include_in_schema=route.include_in_schema, response_class=route.response_class,
                callbacks=route.callbacks, openapi_extra=route.openapi_extra,
                generate_unique_id_function=route.generate_unique_id_function)

    def _call(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """`call`, or its copy whose dependencies are this app's (memoized, so that one route's graph
        holds one copy of a shared dependency and FastAPI's per-request cache calls it once)."""
        if call in self._replacements:
            return self._replacements[call]
        known = self._copies.get(id(call))
        if known is not None:
            return known[1]
        self._copies[id(call)] = (call, call)  # a cycle (none in FastAPI graphs) stops here
        try:
            signature = inspect.signature(call, eval_str=True)  # `Annotated` aliases are strings here
        except (TypeError, ValueError):  # no Python signature (a builtin): it declares no dependencies
            return call
        parameters = [self._parameter(p) for p in signature.parameters.values()]
        copy = call
        if any(new is not old for new, old in zip(parameters, signature.parameters.values(), strict=True)):
            copy = _function_copy(call, signature.replace(parameters=parameters))
        self._copies[id(call)] = (call, copy)  # the original kept alive: its id stays its own
        return copy

    def _parameter(self, p: inspect.Parameter) -> inspect.Parameter:
        default, annotation = p.default, p.annotation
        if isinstance(default, params.Depends):
            default = self._depends(default, annotation)
        if get_origin(annotation) is Annotated:
            base, *metadata = get_args(annotation)
            bound = [self._depends(m, base) if isinstance(m, params.Depends) else m for m in metadata]
            if any(new is not old for new, old in zip(bound, metadata, strict=True)):
                annotation = Annotated[(base, *bound)]
        if default is p.default and annotation is p.annotation:
            return p
        return p.replace(default=default, annotation=annotation)

    def _depends(self, depends: params.Depends, annotation: Any = None) -> params.Depends:
        target = depends.dependency if depends.dependency is not None else annotation
        if not callable(target):
            return depends
        bound = self._call(target)
        return depends if bound is target else dataclasses.replace(depends, dependency=bound)


def _function_copy(call: Callable[..., Any], signature: inspect.Signature) -> Callable[..., Any]:
    """A function that runs `call`'s code (a coroutine or generator function stays one) with
    `signature`, whose dependencies FastAPI reads instead of the original's."""
    if not isinstance(call, types.FunctionType):
        raise TypeError(f"{call!r} reaches a bound part but is not a plain function; make it one")
    copy = types.FunctionType(call.__code__, call.__globals__, call.__name__, call.__defaults__, call.__closure__)
    copy.__kwdefaults__ = call.__kwdefaults__
    copy.__qualname__, copy.__module__, copy.__doc__ = call.__qualname__, call.__module__, call.__doc__
    copy.__dict__.update(call.__dict__)
    copy.__signature__ = signature  # type: ignore[attr-defined]
    return copy


def bound_part(app: FastAPI, placeholder: Callable[..., Any]) -> Any:
    """The part bound in `placeholder`'s place in `app`'s routes (tools that hold the app: the
    console benchmark); LookupError if no route of `app` has it."""
    for route in app.router.routes:
        if isinstance(route, APIRoute):
            for dependant in _walk(route.dependant):
                if isinstance(dependant.call, Part) and dependant.call.placeholder is placeholder:
                    return dependant.call.value
    raise LookupError(f"no route of this app has {getattr(placeholder, '__name__', placeholder)} bound")


def _walk(dependant: Dependant) -> Iterator[Dependant]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _walk(sub)


def app_with(parts: Mapping[Callable[..., Any], Any], *routers: APIRouter, prefix: str = "") -> FastAPI:
    """A bare app serving `routers` (under `prefix`) with `parts` bound (tests and tools)."""
    app = FastAPI()
    binder = RouteBinder(app)
    for placeholder, value in parts.items():
        binder.bind(placeholder, value)
    for router in routers:
        binder.include(router, prefix)
    return app
