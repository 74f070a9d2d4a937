"""`/v1/models` and `/v1/models/{model}`: the one served model's card."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gleanrl.server.http.edge.errors import ApiError

router = APIRouter()


def _card(state) -> dict:
    name, length = state.served_model_name, state.context_length
    return {"id": name, "object": "model", "created": 0, "owned_by": "gleanrl", "root": name, "max_model_len": length}


@router.get("/v1/models")
async def models(request: Request):
    return {"object": "list", "data": [_card(request.app.state)]}


@router.get("/v1/models/{model:path}")
async def model(model: str, request: Request):
    _check_model(request.app.state, model)
    return _card(request.app.state)


def _check_model(state, name: str | None) -> None:
    """/v1/models/{model}: the served name only (SGLang). The generation routes take any `model`
    (clients send their own names; SGLang serves them) and echo it in the reply."""
    if name not in (None, "default", state.served_model_name, state.engine.info().get("model_path")):
        raise ApiError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")
