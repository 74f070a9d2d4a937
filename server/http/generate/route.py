"""SGLang's native /generate on the embedded engine: text or input_ids, single or batch, n samples
per prompt, logprobs, SSE streaming with cumulative chunks. Fields and shapes follow SGLang's
`managers/io_struct.py` (GenerateReqInput) and `tokenizer_manager.py`."""

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
# what rendering a cumulative /generate stream may cost per generated token (`generate`'s chunks):
# with logprobs of a long prompt, the whole answer's cost or less
STREAM_BYTES_PER_TOKEN = 16 * 1024


def _options(state, body: GenerateIn, count: int) -> list[dict]:
    """Per prompt: SGLang's logprob fields (each a value for all prompts, or a list with one per
    prompt), within the server's limits."""
    ids = body.token_ids_logprob
    nested = bool(ids) and isinstance(ids[0], list)
    per_ids = ids if nested else [ids] * count
    if len(per_ids) != count:
        raise ApiError(
            400,
            f"token_ids_logprob: expected {count} entries (one per prompt), got {len(per_ids)}",
            param="token_ids_logprob",
        )
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


def _prompt_count(body: GenerateIn) -> int:
    """How many prompts the body holds, before any is tokenized."""
    if (body.text is None) == (body.input_ids is None):
        raise ApiError(400, "text or input_ids: give exactly one of them", param="text")
    if body.text is not None:
        return len(body.text) if isinstance(body.text, list) else 1
    return len(body.input_ids) if body.input_ids and isinstance(body.input_ids[0], list) else 1


async def _prompts(state, body: GenerateIn) -> tuple[list[list[int]], bool]:
    """Checked token ids of each prompt, and whether the input was a batch."""
    if body.text is not None:
        batch = isinstance(body.text, list)
        raw, field = await encode(state, body.text if batch else [body.text]), "text"
    else:
        batch = bool(body.input_ids) and isinstance(body.input_ids[0], list)
        raw, field = body.input_ids if batch else [body.input_ids], "input_ids"
    if batch and not raw:
        raise bad_field(field, "the batch is empty")
    return [check_prompt(state, ids, _name(field, i, batch)) for i, ids in enumerate(raw)], batch


@router.post("/generate")  # one route per method: each gets its own OpenAPI operation id
@router.put("/generate")
async def generate(request: Request):
    state = request.app.state
    body = await parse(request, GenerateIn)
    refuse_unsupported(body.model_extra or {}, UNSUPPORTED_GENERATE)
    check_serving(state)
    count = _prompt_count(body)
    field = "text" if body.text is not None else "input_ids"
    check_batch(state, count, field)
    sps = _listify(body.sampling_params or SamplingIn(), count, "sampling_params")
    names = [_name("sampling_params", i, isinstance(body.sampling_params, list)) for i in range(len(sps))]
    dumps = [sp.model_dump(exclude_unset=True) for sp in sps]
    params = [sampling(state, d, name) for d, name in zip(dumps, names)]
    specs = [grammar_source(d, f"{name}.") for d, name in zip(dumps, names)]
    reasoning = required_reasoning(state.server_cfg.reasoning_parser, body.require_reasoning, specs)
    check_batch(state, sum(p.n for p in params), field)
    options = _options(state, body, count)
    prompts, batch = await _prompts(state, body)
    if isinstance(body.rid, str) and batch:
        raise ApiError(400, "rid: batch input needs a list of rids", param="rid")
    for i, (ids, p, d) in enumerate(zip(prompts, params, dumps)):
        if "max_new_tokens" in d:
            # SGLang checks an explicit one; the default is clamped by the context
            check_length(state, ids, p, _name(field, i, batch))
    params = [await with_grammar(state, p, await after_reasoning(state, s, reasoning)) for p, s in zip(params, specs)]
    reqs, groups = expand(
        prompts,
        params,
        _listify(body.rid, len(prompts), "rid"),
        _listify(body.return_logprob, len(prompts), "return_logprob"),
        options,
    )
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
        """Chunks are cumulative, so `stream_interval` (SGLang's field) bounds the O(n^2) bytes of a
        long stream: a chunk every `stream_interval` tokens, and always the final one. With
        logprobs a chunk may be megabytes (the prompt's, top_logprobs_num per position): a chunk
        then waits for enough new tokens that rendering costs at most STREAM_BYTES_PER_TOKEN per
        token generated (cumulative chunks lose nothing by coming less often)."""
        track, sp = run.tracks[i], per_req_sp[i]
        every = max(sp.stream_interval or 1, -(-answer_bytes([track]) // STREAM_BYTES_PER_TOKEN))
        if not track.finished and len(track.ids) - sent[i] < every:
            return []
        sent[i] = len(track.ids)
        return [render(state, track, sp, text_lp) | ({} if single else {"index": i})]

    return await stream(run, request, chunks)
