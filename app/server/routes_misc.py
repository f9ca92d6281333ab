"""`GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from app.server.context import Ctx, ServerContext
from app.server.openapi import PLAIN_TEXT

router = APIRouter()  # under the API key
public = APIRouter()  # open: liveness probes and Prometheus scrapes


def _model_card(ctx: ServerContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": ctx.created,
        "owned_by": "tandem",
        "context_length": ctx.context_length,
    }


@router.get("/v1/models")
async def list_models(ctx: Ctx) -> dict[str, Any]:
    """The served model, in OpenAI's list shape."""
    return {"object": "list", "data": [_model_card(ctx)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: Ctx) -> dict[str, Any]:
    """One model card; 404 `model_not_found` for any other name."""
    ctx.resolve_model(model_id)
    return _model_card(ctx)


@public.get("/health")
async def health(ctx: Ctx) -> dict[str, Any]:
    """200 `{"status": "ok", "model": name}` once the model is loaded (it is, before the
    server listens)."""
    return {"status": "ok", "model": ctx.model_name}


@public.get("/metrics", responses=PLAIN_TEXT)
async def metrics(ctx: Ctx) -> Response:
    """Prometheus text exposition (see `app.server.metrics`)."""
    assert ctx.metrics is not None
    return Response(ctx.metrics.render(), media_type=ctx.metrics.content_type)
