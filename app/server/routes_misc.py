"""`GET /v1/models`, `GET /v1/models/{id}`, `GET /health`, `GET /metrics`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from app.server.context import Ctx, ServerContext
from app.server.openapi import PLAIN_TEXT
from app.server.store_models import file_mtime, file_size

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


def _pool_card(slot: Any) -> dict[str, Any]:
    """A store model's card: `size` (file bytes), `loaded`, and `context_length` while
    loaded (it is known once the model is)."""
    card: dict[str, Any] = {"id": slot.name, "object": "model",
                            "created": int(file_mtime(slot.model.path)), "owned_by": "tandem",
                            "size": file_size(slot.model.path), "loaded": slot.engine is not None}
    if slot.engine is not None:
        card["context_length"] = int(slot.engine.context_length)
    return card


@router.get("/v1/models")
async def list_models(ctx: Ctx, loaded: bool = False) -> dict[str, Any]:
    """The served model, in OpenAI's list shape; with a pool every model of the store
    (`?loaded=true`: the loaded ones)."""
    if ctx.pool is not None:
        return {"object": "list", "data": [_pool_card(s) for s in ctx.pool.slots()
                                           if s.engine is not None or not loaded]}
    return {"object": "list", "data": [_model_card(ctx)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: Ctx) -> dict[str, Any]:
    """One model card; 404 `model_not_found` for any other name."""
    ctx.resolve_model(model_id)
    if ctx.pool is not None:
        return _pool_card(ctx.pool.slot(model_id))
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
