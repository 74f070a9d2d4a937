"""The JSON request bodies in FastAPI's OpenAPI document: the routes parse their bodies themselves (`edge/body.py`, for
413 and field-naming 400s), so FastAPI does not see them; clients and fuzzers read them here."""

from __future__ import annotations

from pydantic import BaseModel

from gleanrl.server.http.generate.bodies import GenerateIn
from gleanrl.server.http.native.control import AbortIn, UpdateWeightsIn
from gleanrl.server.http.native.separate_reasoning import SeparateReasoningIn
from gleanrl.server.http.native.tokenize import DetokenizeIn, TokenizeIn
from gleanrl.server.http.native.weights_sync import BeginWeightUpdateIn, TensorUpdateIn
from gleanrl.server.http.openai.bodies import ChatIn, CompletionIn

REQUEST_BODIES: dict[str, type[BaseModel]] = {
    "/generate": GenerateIn,
    "/update_weights_from_disk": UpdateWeightsIn,
    "/abort_request": AbortIn,
    "/update_weights_from_tensor": TensorUpdateIn,
    "/begin_weight_update": BeginWeightUpdateIn,
    "/v1/completions": CompletionIn,
    "/v1/chat/completions": ChatIn,
    "/tokenize": TokenizeIn,
    "/v1/tokenize": TokenizeIn,
    "/detokenize": DetokenizeIn,
    "/v1/detokenize": DetokenizeIn,
    "/separate_reasoning": SeparateReasoningIn,
}


def describe_bodies(schema: dict) -> dict:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in REQUEST_BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        for method, op in schema.get("paths", {}).get(path, {}).items():
            if method in ("post", "put"):
                ref = {"$ref": f"#/components/schemas/{model.__name__}"}
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return schema
