"""FastAPI dependencies of the key broker."""

from __future__ import annotations

from fastapi import Request

from key_broker.service import KeyBrokerService


def get_service(request: Request) -> KeyBrokerService:
    return request.app.state.service
