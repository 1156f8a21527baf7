"""The signed-in person's own key-broker token, which the console forwards (it holds none itself).

The gateway, and so the console in it, is outside the trust boundary: it has no broker credential
of its own (issue #32). A tenant admin who wants the Keys page (key state, receipts, release
policies) or to revoke the tenant key from the browser gives the console its own tenant-admin
token of the broker once ("Connect the key broker"); the browser keeps it in an HttpOnly,
SameSite=Strict cookie scoped to /console (Secure like the session cookie), and the console sends
it with each broker call it makes for that person, after its own role and tenant checks. The broker
then decides with the tenant's authority; its audit entry names that token. Logging out, or
"Disconnect", deletes the cookie. The gateway never writes the token anywhere.
"""

from __future__ import annotations

from fastapi import Request

COOKIE = "sealed_console_broker"
MAX_CHARS = 256


def broker_token(request: Request) -> str | None:
    """The token this browser gave the console, if any (never logged, never rendered)."""
    token = request.cookies.get(COOKIE, "").strip()
    return token if token and len(token) <= MAX_CHARS and token.isascii() and token.isprintable() else None


def set_broker_cookie(response, token: str, *, secure: bool, max_age: int) -> None:  # type: ignore[no-untyped-def]
    response.set_cookie(COOKIE, token, max_age=max_age, path="/console", httponly=True, samesite="strict",
                        secure=secure)


def delete_broker_cookie(response) -> None:  # type: ignore[no-untyped-def]
    response.delete_cookie(COOKIE, path="/console")
