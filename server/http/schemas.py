"""Pydantic request models for the HTTP edge (the only place pydantic is used). Field names follow
SGLang's `GenerateReqInput`, `UpdateWeightFromDiskReqInput`, `AbortReq` and its OpenAI protocol.
Types are checked here; value ranges are checked by `server.protocol.SamplingParams`."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

# ints are accepted, strings and bools are not
Number = StrictFloat
Stop = StrictStr | list[StrictStr] | None
M = TypeVar("M", bound=BaseModel)
OFF_LOOP_BYTES = 64 * 1024  # bodies larger than this are parsed in a worker thread

# SGLang fields the embedded engine does not implement: accepted only unset (None, "", False, [],
# {}), otherwise a 400 naming the field (never accepted and ignored).
UNSUPPORTED_SAMPLING = ("structural_tag",)
UNSUPPORTED_OPENAI = (
    "functions",
    "function_call",
    "structural_tag",
    "lora_path",
    "return_hidden_states",
    "custom_logit_processor",
    "audio",
    "prediction",
)
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # the chat route's only
UNSUPPORTED_GENERATE = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "lora_id",
    "custom_logit_processor",
    "return_hidden_states",
    "session_params",
    "return_routed_experts",
    "return_entropy",
    "return_sampling_mask",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
    "max_thinking_tokens",
    "return_indexer_topk",
    "multi_item_delimiter_indices",
    "token_indices_to_pool",
    "positional_embed_overrides",
    "watermark",
    "return_bytes",
)


class SamplingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_new_tokens: StrictInt = 128
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    min_p: Number = 0.0
    stop: Stop = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    n: StrictInt = 1
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = None  # gleanrl alias of sampling_seed
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    stream_interval: StrictInt | None = None
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    min_new_tokens: StrictInt = 0
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None
    structural_tag: Any = None
    logit_bias: dict[StrictStr, Number] | None = None
    stop_regex: Stop = None
    # accepted; no custom logit processor reads it
    custom_params: dict[StrictStr, Any] | None = None


class GenerateIn(BaseModel):
    # extras: checked against UNSUPPORTED_GENERATE, others ignored
    model_config = ConfigDict(extra="allow")
    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: SamplingIn | list[SamplingIn] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: StrictInt | list[StrictInt] = -1
    top_logprobs_num: StrictInt | list[StrictInt] = 0
    token_ids_logprob: list[StrictInt] | list[list[StrictInt]] | None = None
    return_text_in_logprobs: StrictBool = False
    rid: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    require_reasoning: StrictBool = False  # the grammar held after </think> (grammar.after_reasoning)


def refuse_unsupported(values: dict, names: tuple[str, ...], prefix: str = "") -> None:
    """A 400 naming the first field of `names` that is set in `values` (unset: None, "",
    False, [], {})."""
    for name in names:
        if values.get(name) not in (None, "", False, [], {}):
            field = f"{prefix}{name}"
            raise ApiError(400, f"{field} is not supported by the embedded engine", param=field)


class UpdateWeightsIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_path: StrictStr
    load_format: StrictStr | None = None
    weight_version: StrictStr | None = None
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    selector: Literal["target", "draft"] = "target"


class TensorUpdateIn(BaseModel):
    """SGLang's UpdateWeightsFromTensorReqInput (one payload per TP rank)."""

    model_config = ConfigDict(extra="ignore")
    serialized_named_tensors: list[StrictStr] = Field(min_length=1)
    load_format: StrictStr | None = None
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    selector: Literal["target", "draft"] = "target"


class BeginWeightUpdateIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    selector: Literal["target", "draft"] = "target"


class AbortIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: StrictStr = ""
    abort_all: StrictBool = False


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class OpenAISampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI's, plus
    SGLang's extras)."""

    # extras: checked against UNSUPPORTED_OPENAI, others ignored
    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None  # any name: the served model, echoed (SGLang)
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: StrictInt | None = None
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    user: StrictStr | None = None
    top_k: StrictInt = -1
    min_p: Number = 0.0
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    rid: StrictStr | None = None
    repetition_penalty: Number = 1.0  # SGLang's extra sampling fields
    min_tokens: StrictInt = 0
    logit_bias: dict[StrictStr, Number] | None = None
    stop_regex: Stop = None
    custom_params: dict[StrictStr, Any] | None = None


class CompletionIn(OpenAISampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: StrictInt | None = None  # up to --max-top-logprobs-num (SGLang: no limit)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (history)
    tool_call_id: StrictStr | None = None  # a tool message's answer to one
    name: StrictStr | None = None


class ChatIn(OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    separate_reasoning: StrictBool = True  # with --reasoning-parser (SGLang's fields)
    stream_reasoning: StrictBool = True
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None


class SeparateReasoningIn(BaseModel):
    """SGLang's SeparateReasoningReqInput."""

    model_config = ConfigDict(extra="ignore")
    text: StrictStr
    reasoning_parser: StrictStr
    return_blocks: StrictBool = False


class TokenizeIn(BaseModel):
    """SGLang's TokenizeRequest: exactly one of `prompt` and `messages`."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr] | None = None
    messages: list[ChatMessage] | None = None
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool | None = None


class DetokenizeIn(BaseModel):
    """SGLang's DetokenizeRequest."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    tokens: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: StrictBool = True


class ApiError(Exception):
    """An error the edge answers with `status` and OpenAI's error shape; the message
    names the field."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: int | str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status if self.code is None else self.code,
            }
        }


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _loc(loc: tuple) -> str:
    """('sampling_params', 'SamplingIn', 'temperature') -> 'sampling_params.temperature' (drops
    union tags)."""
    keep = [str(p) for p in loc if isinstance(p, int) or (p.isidentifier() and p.islower() and p not in _TYPE_TAGS)]
    return ".".join(keep) or "body"


def validation_error(exc: ValidationError) -> ApiError:
    seen: dict[str, str] = {}
    for err in exc.errors():
        seen.setdefault(_loc(err["loc"]), err["msg"])
    # a union reports every branch; keep the deepest paths (the field that is actually wrong)
    seen = {k: v for k, v in seen.items() if not any(o.startswith(k + ".") for o in seen)}
    param = next(iter(seen))
    return ApiError(400, "; ".join(f"{k}: {v}" for k, v in list(seen.items())[:3]), param=param)


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def too_large(max_bytes: int, declared: int | None = None, setting: str = "--max-request-bytes") -> ApiError:
    """The 413 of a body over `max_bytes` (set by the flag `setting`); `Connection: close`
    (server/http/body_limit.py)."""
    size = f" of {declared} bytes" if declared is not None else ""
    return ApiError(
        413,
        f"request body{size} is over the limit of {max_bytes} bytes ({setting})",
        param="body",
        headers={"Connection": "close"},
    )


async def read_body(request, max_bytes: int, setting: str = "--max-request-bytes") -> bytes:
    """The request body; 413 over `max_bytes` (declared or streamed; `BodyLimit` refuses first)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes, int(declared), setting)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes, setting=setting)
        chunks.append(chunk)
    return b"".join(chunks)


async def off_loop(fn, size: int, *args):
    """`fn(*args)`, in a worker thread when its input is over OFF_LOOP_BYTES: parsing a large
    body on the event loop would stall every stream it serves."""
    return await asyncio.to_thread(fn, *args) if size > OFF_LOOP_BYTES else fn(*args)


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON body: {str(exc)[:200]}", param="body") from None


async def read_json(request, max_bytes: int) -> Any:
    """The request body as JSON; 413 over `max_bytes`, 415 unless JSON by content type, 400 when it
    is not JSON."""
    return await _json(request, await read_body(request, max_bytes))


async def _json(request, raw: bytes) -> Any:
    if not raw.strip():
        return {}
    kind = request.headers.get("content-type")
    if kind is not None and not _is_json(kind):  # a browser form's types are refused (CSRF)
        raise ApiError(415, f"Content-Type must be application/json, got {kind[:100]!r}", param="content-type")
    return await off_loop(_loads, len(raw), raw)


def _validate(model: type[M], data: dict) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def parse(request, model: type[M], max_bytes: int, setting: str = "--max-request-bytes") -> M:
    raw = await read_body(request, max_bytes, setting)
    data = await _json(request, raw)
    if not isinstance(data, dict):
        raise ApiError(400, "the JSON body must be an object", param="body")
    return await off_loop(_validate, len(raw), model, data)


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
    """Add the JSON request bodies to FastAPI's OpenAPI document (the routes parse their bodies
    themselves, for 413 and field-naming 400s, so FastAPI does not see them); clients and fuzzers
    read them here."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in REQUEST_BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        for method, op in schema.get("paths", {}).get(path, {}).items():
            if method in ("post", "put"):
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                }
    return schema


class InitGroupIn(BaseModel):
    """SGLang's InitWeightsUpdateGroupReqInput."""

    model_config = ConfigDict(extra="ignore")
    master_address: StrictStr
    master_port: StrictInt
    rank_offset: StrictInt
    world_size: StrictInt = Field(ge=2)
    group_name: StrictStr = "weight_update_group"
    backend: Literal["gloo", "nccl"] = "nccl"


class DistributedUpdateIn(BaseModel):
    """SGLang's UpdateWeightsFromDistributedReqInput."""

    model_config = ConfigDict(extra="ignore")
    names: list[StrictStr] = Field(min_length=1)
    dtypes: list[StrictStr]
    shapes: list[list[StrictInt]]
    group_name: StrictStr = "weight_update_group"
    flush_cache: StrictBool = True
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | None = None
    load_format: StrictStr | None = None
    selector: Literal["target", "draft"] = "target"


class DestroyGroupIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    group_name: StrictStr = "weight_update_group"


class MemoryTagsIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tags: list[StrictStr] | None = None
