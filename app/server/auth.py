"""API-key check: `Authorization: Bearer KEY` on `/v1` paths, compared in constant time.

A pure ASGI middleware rather than a route dependency: it answers before the body is read
or validated, so a client without the key learns nothing about the request (401, not 400).
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.errors import APIError

GUARDED_PREFIX = "/v1"


def check_api_key(expected: str, authorization: str) -> APIError | None:
    """The 401 `invalid_api_key` error (OpenAI's body) for an `Authorization` header value,
    or None when it carries `expected`."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        message = "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'."
    elif not hmac.compare_digest(given.strip().encode(), expected.encode()):
        message = "Incorrect API key provided."
    else:
        return None
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class APIKeyMiddleware:
    """Refuses HTTP requests under `/v1` without `api_key`; `/health` and `/metrics` stay
    open. Install inside CORS, so browsers' preflight requests (which carry no key) pass."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIX):
            error = check_api_key(self.api_key, Headers(scope=scope).get("authorization", ""))
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
