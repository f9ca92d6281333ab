"""API-key check on `/v1`, `/api` and `/tandem` paths, compared in constant time: `Authorization:
Bearer KEY`, or Anthropic's `x-api-key: KEY` header (what the `anthropic` client and Claude
Code send). A refusal is a 401 in the shape of the path's API (`app.server.errors`).

A pure ASGI middleware rather than a route dependency: it answers before the body is read
or validated, so a client without the key learns nothing about the request (401, not 400).
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.errors import APIError

GUARDED_PREFIXES = ("/v1", "/api/", "/tandem/")


def check_api_key(expected: str, authorization: str, x_api_key: str = "") -> APIError | None:
    """The 401 `invalid_api_key` error for an `Authorization` header value (or, when that is
    empty, an `x-api-key` value), or None when it carries `expected`."""
    scheme, _, given = authorization.partition(" ")
    if not authorization and x_api_key:
        scheme, given = "bearer", x_api_key
    if scheme.lower() != "bearer" or not given.strip():
        message = ("You didn't provide an API key. Send it as 'Authorization: Bearer KEY' "
                   "or 'x-api-key: KEY'.")
    elif not hmac.compare_digest(given.strip().encode(), expected.encode()):
        message = "Incorrect API key provided."
    else:
        return None
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class APIKeyMiddleware:
    """Refuses HTTP requests under `/v1` and `/api` without `api_key`; `/health` and `/metrics` stay
    open. Install inside CORS, so browsers' preflight requests (which carry no key) pass."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIXES):
            headers = Headers(scope=scope)
            error = check_api_key(self.api_key, headers.get("authorization", ""),
                                  headers.get("x-api-key", ""))
            if error is not None:
                await error.response(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)
