"""SGLang's native /generate: its request bodies (`GenerateReqInput` and sampling params; types checked here,
value ranges by `server.protocol.SamplingParams`), text or input_ids, single or batch, n samples per prompt,
logprobs, SSE streaming with cumulative chunks."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.edge.errors import ApiError, bad_field, refuse_unsupported
from gleanrl.server.http.edge.limits import check_batch, check_serving, check_token_ids, check_top_logprobs, encode
from gleanrl.server.http.generate.answer import answer_bytes, render, stream, whole
from gleanrl.server.http.generate.grammar import after_reasoning, grammar_source, required_reasoning
from gleanrl.server.http.generate.params import check_length, check_prompt, expand, sampling, start_run, with_grammar

router = APIRouter()
STREAM_BYTES_PER_TOKEN = 16 * 1024
# ints are accepted, strings and bools are not
Number = StrictFloat
Stop = StrictStr | list[StrictStr] | None

# SGLang fields the embedded engine does not implement: a 400 naming the field unless unset
UNSUPPORTED_GENERATE = tuple(
    """input_embeds image_data video_data audio_data lora_path lora_id custom_logit_processor return_hidden_states
    session_params return_routed_experts return_entropy return_sampling_mask return_flat_raw_top_logprobs
    return_flat_raw_output_top_logprobs max_thinking_tokens return_indexer_topk multi_item_delimiter_indices
    token_indices_to_pool positional_embed_overrides watermark return_bytes""".split()
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
    custom_params: dict[StrictStr, Any] | None = None  # accepted; no custom logit processor reads it


class GenerateIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # extras: checked against UNSUPPORTED_GENERATE, others ignored
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


def _options(state, body: GenerateIn, count: int) -> list[dict]:
    """Per prompt: SGLang's logprob fields (each one value for all prompts or one per prompt), checked."""
    ids = body.token_ids_logprob
    nested = bool(ids) and isinstance(ids[0], list)
    per_ids = _listify(ids, count, "token_ids_logprob") if nested else [ids] * count
    for i, one in enumerate(per_ids if nested else per_ids[:1]):
        check_token_ids(state, one, _name("token_ids_logprob", i, nested))
    starts = _listify(body.logprob_start_len, count, "logprob_start_len")
    tops = _listify(body.top_logprobs_num, count, "top_logprobs_num")
    for k in tops:
        check_top_logprobs(state, k, "top_logprobs_num")
    return [
        {"logprob_start_len": s, "top_logprobs_num": k, "token_ids_logprob": t}
        for s, k, t in zip(starts, tops, per_ids)
    ]


def _listify(value, count: int, field: str) -> list:
    if isinstance(value, list):
        if len(value) != count:
            raise bad_field(field, f"expected {count} entries (one per prompt), got {len(value)}")
        return value
    return [value] * count


def _name(field: str, i: int, batch: bool) -> str:
    return f"{field}.{i}" if batch else field


def _given(body: GenerateIn) -> tuple[str, bool, list]:
    """The prompts' field, whether it holds a batch, and the prompts as given (texts or ids)."""
    if (body.text is None) == (body.input_ids is None):
        raise ApiError(400, "text or input_ids: give exactly one of them", param="text")
    if body.text is not None:
        batch = isinstance(body.text, list)
        return "text", batch, body.text if batch else [body.text]
    batch = bool(body.input_ids) and isinstance(body.input_ids[0], list)
    return "input_ids", batch, body.input_ids if batch else [body.input_ids]


@router.post("/generate")  # one route per method: each gets its own OpenAPI operation id
@router.put("/generate")
async def generate(request: Request):
    state = request.app.state
    body = await parse(request, GenerateIn)
    refuse_unsupported(body.model_extra or {}, UNSUPPORTED_GENERATE)
    check_serving(state)
    field, batch, given = _given(body)
    count = len(given)
    check_batch(state, count, field)
    sps = _listify(body.sampling_params or SamplingIn(), count, "sampling_params")
    names = [_name("sampling_params", i, isinstance(body.sampling_params, list)) for i in range(len(sps))]
    dumps = [sp.model_dump(exclude_unset=True) for sp in sps]
    params = [sampling(state, d, name) for d, name in zip(dumps, names)]
    specs = [grammar_source(d, f"{name}.") for d, name in zip(dumps, names)]
    reasoning = required_reasoning(state.server_cfg.reasoning_parser, body.require_reasoning, specs)
    check_batch(state, sum(p.n for p in params), field)
    options = _options(state, body, count)
    raw = await encode(state, given) if field == "text" else given
    if batch and not raw:
        raise bad_field(field, "the batch is empty")
    prompts = [check_prompt(state, ids, _name(field, i, batch)) for i, ids in enumerate(raw)]
    if isinstance(body.rid, str) and batch:
        raise bad_field("rid", "batch input needs a list of rids")
    for i, (ids, p, d) in enumerate(zip(prompts, params, dumps)):
        if "max_new_tokens" in d:
            # SGLang checks an explicit one; the default is clamped by the context
            check_length(state, ids, p, _name(field, i, batch))
    params = [await with_grammar(state, p, await after_reasoning(state, s, reasoning)) for p, s in zip(params, specs)]
    rids, logprob = _listify(body.rid, count, "rid"), _listify(body.return_logprob, count, "return_logprob")
    reqs, groups = expand(prompts, params, rids, logprob, options)
    per_req_sp = [sp for sp, p in zip(sps, params) for _ in range(p.n)]
    single = not batch and params[0].n == 1
    text_lp = body.return_text_in_logprobs
    run = start_run(state, reqs, groups)
    if not body.stream:

        def shape(tracks) -> dict | list:
            outs = [render(state, t, sp, text_lp) for t, sp in zip(tracks, per_req_sp)]
            return outs[0] if single else outs

        answer = await whole(run, request, shape)
        return Response(status_code=499) if answer is None else answer
    sent = [0] * len(reqs)

    def chunks(i: int) -> list[dict]:
        """Cumulative chunks, one every `stream_interval` tokens (SGLang's) and the final one; a chunk
        of megabytes (logprobs) waits for enough new tokens that rendering costs at most
        STREAM_BYTES_PER_TOKEN per token (cumulative chunks lose nothing by coming less often)."""
        track, sp = run.tracks[i], per_req_sp[i]
        every = max(sp.stream_interval or 1, -(-answer_bytes([track]) // STREAM_BYTES_PER_TOKEN))
        if not track.finished and len(track.ids) - sent[i] < every:
            return []
        sent[i] = len(track.ids)
        return [render(state, track, sp, text_lp) | ({} if single else {"index": i})]

    return await stream(run, request, chunks)
