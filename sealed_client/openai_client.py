"""Drop-in subclasses of the official openai clients that seal every request (docs/sealed-mode.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import openai

from protocol.sealed.padding import DEFAULT_PADDING, PaddingPolicy
from sealed_client.errors import UnsealedRequest
from sealed_client.session import SealedSession
from sealed_client.transport import AsyncSealedTransport, SealedTransport
from sealed_client.trust import ClientTrust


def _trust(policy: ClientTrust | str | Path | dict[str, Any] | None, unsafe_allow_simulated: bool) -> ClientTrust:
    if isinstance(policy, ClientTrust):
        return policy
    if isinstance(policy, dict):
        return ClientTrust.from_dict(policy, unsafe_allow_simulated=unsafe_allow_simulated)
    if policy is None:
        raise ValueError("SealedOpenAI needs a client policy (ClientTrust, dict, or a JSON file path)")
    return ClientTrust.load(policy, unsafe_allow_simulated=unsafe_allow_simulated)


def _own_http_client(kwargs: dict[str, Any], sealing: tuple[type, ...], unsafe_allow_plaintext: bool) -> None:
    """A caller's own `http_client` would carry every request past the sealing transport: refused
    (give `inner_transport` to route sealed requests your own way), unless it is one of ours (the SDK's
    `copy()` passes the client's own) or the caller asked for plaintext."""
    client = kwargs.get("http_client")
    if client is None or isinstance(getattr(client, "_transport", None), sealing):
        return
    if not unsafe_allow_plaintext:
        raise UnsealedRequest("a caller-supplied http_client bypasses sealing; pass inner_transport= instead "
                              "(or unsafe_allow_plaintext=True to send in plaintext)")


def _gateway_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _sealed_session(kwargs: dict[str, Any], own_transports: tuple[type, ...], policy: Any,
                    unsafe_allow_simulated: bool, clock: Callable[[], dt.datetime] | None,
                    padding: PaddingPolicy, retrieval_model: str | None) -> tuple[SealedSession, bool]:
    """The session both clients seal with, and the plaintext opt-in (taken from kwargs, where the
    openai client's own options pass through); a caller's http_client that bypasses sealing is refused."""
    unsafe_allow_plaintext = bool(kwargs.pop("unsafe_allow_plaintext", False))
    _own_http_client(kwargs, own_transports, unsafe_allow_plaintext)
    return SealedSession(_trust(policy, unsafe_allow_simulated), clock=clock, padding=padding,
                         retrieval_model=retrieval_model), unsafe_allow_plaintext


class SealedOpenAI(openai.OpenAI):
    """`openai.OpenAI` whose chat and completion requests are sealed to the attested worker.

    The deployment is verified on first use and whenever the worker key changes; every answer's
    receipt is checked (kept in `client.sealed.receipts`). `retrieval_model`: the embedding model
    whose worker seals `files.create` and `vector_stores.search` (docs/retrieval.md "Sealed mode").
    """

    def __init__(self, *, base_url: str, api_key: str, policy: ClientTrust | str | Path | dict[str, Any] | None = None,
                 unsafe_allow_simulated: bool = False, clock: Callable[[], dt.datetime] | None = None,
                 inner_transport: httpx2.BaseTransport | None = None, padding: PaddingPolicy = DEFAULT_PADDING,
                 retrieval_model: str | None = None, **kwargs: Any) -> None:
        self.sealed, unsafe_allow_plaintext = _sealed_session(kwargs, (SealedTransport,), policy,
                                                              unsafe_allow_simulated, clock, padding,
                                                              retrieval_model)
        transport = SealedTransport(self.sealed, _gateway_url(base_url), inner_transport,
                                    unsafe_allow_plaintext=unsafe_allow_plaintext)
        kwargs.setdefault("http_client", httpx2.Client(transport=transport, timeout=kwargs.pop("timeout", 600.0)))
        super().__init__(base_url=base_url, api_key=api_key, **kwargs)


class AsyncSealedOpenAI(openai.AsyncOpenAI):
    """`openai.AsyncOpenAI`, sealed like SealedOpenAI."""

    def __init__(self, *, base_url: str, api_key: str, policy: ClientTrust | str | Path | dict[str, Any] | None = None,
                 unsafe_allow_simulated: bool = False, clock: Callable[[], dt.datetime] | None = None,
                 inner_transport: httpx2.AsyncBaseTransport | None = None, padding: PaddingPolicy = DEFAULT_PADDING,
                 retrieval_model: str | None = None, **kwargs: Any) -> None:
        self.sealed, unsafe_allow_plaintext = _sealed_session(kwargs, (AsyncSealedTransport,), policy,
                                                              unsafe_allow_simulated, clock, padding,
                                                              retrieval_model)
        transport = AsyncSealedTransport(self.sealed, _gateway_url(base_url), inner_transport,
                                         unsafe_allow_plaintext=unsafe_allow_plaintext)
        kwargs.setdefault("http_client", httpx2.AsyncClient(transport=transport,
                                                            timeout=kwargs.pop("timeout", 600.0)))
        super().__init__(base_url=base_url, api_key=api_key, **kwargs)
