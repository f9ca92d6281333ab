"""API-key check: `Authorization: Bearer KEY`, compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request

from app.server.errors import APIError


def require_api_key(request: Request) -> None:
    """FastAPI dependency for the `/v1` routes.

    Does nothing when the app has no key. Raises APIError 401 `invalid_api_key` (OpenAI's
    body) when the header is missing or the key differs.
    """
    expected: str | None = request.app.state.api_key
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise APIError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise APIError(
            401,
            "Incorrect API key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
