"""api/parts.py: parts bound into routes once, per app, wherever a placeholder sits in a route's
dependency graph; a shared dependency still runs once a request; what is not bound fails closed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import pytest
from fastapi import APIRouter, Depends, FastAPI, Header
from fastapi.testclient import TestClient

from api.parts import RouteBinder, app_with, bound_part


async def get_name() -> str:
    raise RuntimeError("no name bound")


Name = Annotated[str, Depends(get_name)]
calls: list[str] = []  # what the dependencies saw, per test (cleared by the fixture)
closed: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    calls.clear()
    closed.clear()
    yield


async def caller(name: Name, x_user: str = Header("")) -> str:
    calls.append(f"{name}:{x_user}")
    return f"{x_user}@{name}"


def session(name: Name) -> Iterator[str]:  # a generator dependency (sync: FastAPI runs it in a thread)
    yield f"session-{name}"
    closed.append(name)


def untouched(x_user: str = Header("")) -> str:  # reaches no placeholder: used as it is
    return x_user.upper()


router = APIRouter(prefix="/p")


@router.get("/who")
async def who(user: str = Depends(caller), again: str = Depends(caller), name: Name = "",
              s: str = Depends(session), u: str = Depends(untouched)) -> dict[str, str]:
    return {"user": user, "again": again, "name": name, "session": s, "upper": u}


def test_each_app_gets_its_own_parts_from_one_router() -> None:
    one = app_with({get_name: "one"}, router)
    two = app_with({get_name: "two"}, router, prefix="/v2")
    with TestClient(one) as a, TestClient(two) as b:
        ra = a.get("/p/who", headers={"x-user": "ann"})
        rb = b.get("/v2/p/who", headers={"x-user": "bob"})
    assert ra.json() == {"user": "ann@one", "again": "ann@one", "name": "one", "session": "session-one",
                         "upper": "ANN"}
    assert rb.json()["user"] == "bob@two" and rb.json()["name"] == "two"
    assert calls == ["one:ann", "two:bob"]  # the shared dependency ran once a request, not twice
    assert closed == ["one", "two"]  # the generator's cleanup still runs
    assert one.dependency_overrides == {} and two.dependency_overrides == {}
    assert bound_part(one, get_name) == "one" and bound_part(two, get_name) == "two"
    assert [d.call for d in next(r for r in one.router.routes if getattr(r, "path", "") == "/p/who").dependant
            .dependencies].count(untouched) == 1  # a dependency that reaches no part is not copied


def test_a_placeholder_left_unbound_fails_closed() -> None:
    app = app_with({}, router)
    with TestClient(app, raise_server_exceptions=True) as client, pytest.raises(RuntimeError, match="no name bound"):
        client.get("/p/who")
    with pytest.raises(LookupError):
        bound_part(app, get_name)


def test_a_part_bound_after_its_route_was_included_is_not_in_that_route() -> None:
    app = FastAPI()
    binder = RouteBinder(app)
    binder.include(router)
    binder.bind(get_name, "late")
    with TestClient(app, raise_server_exceptions=True) as client, pytest.raises(RuntimeError, match="no name bound"):
        client.get("/p/who")


def test_replace_puts_another_dependency_in_ones_place() -> None:
    app = FastAPI()
    binder = RouteBinder(app)
    binder.bind(get_name, "n")
    binder.replace(caller, lambda: "replaced")
    binder.include(router)
    with TestClient(app) as client:
        assert client.get("/p/who").json()["user"] == "replaced"
    assert calls == []


def test_a_nested_router_or_a_callable_object_on_the_path_to_a_part_is_refused() -> None:
    outer = APIRouter()
    outer.include_router(router)
    with pytest.raises(TypeError, match="include its routers one by one"):
        app_with({get_name: "n"}, outer)

    class Check:
        async def __call__(self, name: Name) -> str:
            return name

    objects = APIRouter()

    @objects.get("/o")
    async def uses_object(v: str = Depends(Check())) -> str:
        return v

    with pytest.raises(TypeError, match="not a plain function"):
        app_with({get_name: "n"}, objects)
