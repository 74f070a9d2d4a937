"""The edge's answers. As JSON bytes with orjson, as SGLang renders them: ~5-10x faster than `json` on megabyte
logprob answers, which hold the GIL while they render; UTF-8 kept raw, non-string keys allowed, NaN and +-inf as
null (strict parsers refuse `json`'s NaN, Infinity). The one error shape, `ApiError` (a status and OpenAI's error
body naming the field), and its usual cases: pydantic's validation errors, a field the engine does not implement, a
body over its limit; the answer a pure ASGI middleware sends with one."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import orjson
from fastapi.responses import JSONResponse, Response

if TYPE_CHECKING:
    from pydantic import ValidationError

SSE_DONE = b"data: [DONE]\n\n"
_OPTIONS = orjson.OPT_NON_STR_KEYS
# raw line separators would cut a data line in two for clients that split lines like
# str.splitlines (httpx's aiter_lines; a tiny random model emits them): escaped in the JSON string
_LINE_BREAKS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"), (b"\xc2\x85", b"\\u0085"))


def json_bytes(obj) -> bytes:
    data = orjson.dumps(obj, option=_OPTIONS)
    for raw, escaped in _LINE_BREAKS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def sse(obj) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def json_response(obj, status_code: int = 200) -> Response:
    return Response(json_bytes(obj), status_code=status_code, media_type="application/json")


class ApiError(Exception):
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
        code = self.status if self.code is None else self.code
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _loc(loc: tuple) -> str:
    """('sampling_params', 'SamplingIn', 'temperature') -> 'sampling_params.temperature' (drops union tags)."""
    keep = [str(p) for p in loc if isinstance(p, int) or (p.isidentifier() and p.islower() and p not in _TYPE_TAGS)]
    return ".".join(keep) or "body"


def validation_error(exc: ValidationError) -> ApiError:
    seen: dict[str, str] = {}
    for err in exc.errors():
        seen.setdefault(_loc(err["loc"]), err["msg"])
    # a union reports every branch; keep the deepest paths (the field that is actually wrong)
    seen = {k: v for k, v in seen.items() if not any(o.startswith(k + ".") for o in seen)}
    return ApiError(400, "; ".join(f"{k}: {v}" for k, v in list(seen.items())[:3]), param=next(iter(seen)))


def bad_field(field: str, why: str) -> ApiError:
    return ApiError(400, f"{field}: {why}", param=field)


def refuse_unsupported(values: dict, names: tuple[str, ...], prefix: str = "") -> None:
    """A 400 naming the first of `names` set in `values` (unset: None, "", False, [], {}): an SGLang
    field the embedded engine does not implement is never accepted and ignored."""
    for name in names:
        if values.get(name) not in (None, "", False, [], {}):
            raise ApiError(400, f"{prefix}{name} is not supported by the embedded engine", param=f"{prefix}{name}")


def too_large(max_bytes: int, declared: int | None = None, setting: str = "--max-request-bytes") -> ApiError:
    """The 413 of a body over `max_bytes` (set by the flag `setting`); `Connection: close`."""
    size = f" of {declared} bytes" if declared is not None else ""
    message = f"request body{size} is over the limit of {max_bytes} bytes ({setting})"
    return ApiError(413, message, param="body", headers={"Connection": "close"})


async def send_error(send, exc: ApiError) -> None:
    """Answer with `exc` from a pure ASGI middleware, before any route."""
    body = exc.encoded()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
