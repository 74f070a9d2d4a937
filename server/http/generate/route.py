"""SGLang's native /generate (its `GenerateReqInput` and answer shapes): text or input_ids, single or
batch, n samples per prompt, logprobs, SSE streaming with cumulative chunks."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gleanrl.server.http.edge.body import parse
from gleanrl.server.http.edge.errors import ApiError, bad_field, refuse_unsupported
from gleanrl.server.http.edge.limits import check_batch, check_serving, check_token_ids, check_top_logprobs, encode
from gleanrl.server.http.generate.answer import answer_bytes, render, stream, whole
from gleanrl.server.http.generate.bodies import UNSUPPORTED_GENERATE, GenerateIn, SamplingIn
from gleanrl.server.http.generate.grammar import after_reasoning, grammar_source, required_reasoning
from gleanrl.server.http.generate.params import check_length, check_prompt, expand, sampling, start_run, with_grammar

router = APIRouter()
STREAM_BYTES_PER_TOKEN = 16 * 1024


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
    run = await start_run(state, reqs, groups)
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
