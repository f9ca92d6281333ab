"""`GET /tandem/ps`: the models of a server that serves the model store, loaded or not.

`{"max_loaded_models", "memory_budget" (bytes, null = none), "keep_alive" (the default for
models loaded on demand, seconds; null = forever), "models": [...]}`, each model as
`model_pool.describe_slots` says; `?loaded=true` lists the loaded ones only. Only on a
server with a pool (`tandem serve`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.server.context import Ctx
from app.server.model_pool import describe_slots

router = APIRouter()


@router.get("/tandem/ps")
async def ps(ctx: Ctx, loaded: bool = False) -> dict[str, Any]:
    pool = ctx.pool
    return {"max_loaded_models": pool.max_loaded, "memory_budget": pool.memory_budget,
            "keep_alive": pool.keep_alive_s,
            "models": describe_slots(pool.slots(), loaded_only=loaded)}
