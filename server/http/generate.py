"""SGLang's native /generate on the embedded engine: text or input_ids, single or batch, n samples
per prompt, logprobs, SSE streaming with cumulative chunks. Fields and shapes follow SGLang's
`managers/io_struct.py` (GenerateReqInput) and `tokenizer_manager.py`; gleanrl adds
`draft_weight_version` and `spec_accept_length` to meta_info. Also the request-building helpers the
OpenAI routes share."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gleanrl.server.http.detok import output_text
from gleanrl.server.http.fanin import Disconnected, Fanin, Track, collect, unless_disconnected, wait_disconnect
from gleanrl.server.http.grammar import after_reasoning, compile_grammar, grammar_source, required_reasoning
from gleanrl.server.http.limits import (
    check_batch,
    check_logprob_volume,
    check_queue,
    check_serving,
    check_token_ids,
    check_top_logprobs,
    encode,
)
from gleanrl.server.http.logprobs import fill_input_logprobs, logprob_fields
from gleanrl.server.http.render import SSE_DONE, json_response, sse
from gleanrl.server.http.schemas import (
    UNSUPPORTED_GENERATE,
    UNSUPPORTED_SAMPLING,
    ApiError,
    GenerateIn,
    SamplingIn,
    off_loop,
    parse,
    refuse_unsupported,
)
from gleanrl.server.protocol import GenerateRequest, SamplingParams
from gleanrl.server.sampling.stopping import check_stops, compile_stop_regex

router = APIRouter()
# what rendering a cumulative /generate stream may cost per generated token (`generate`'s chunks):
# with logprobs of a long prompt, the whole answer's cost or less
STREAM_BYTES_PER_TOKEN = 16 * 1024


def check_prompt(state, ids: list[int], field: str) -> list[int]:
    if not ids:
        raise ApiError(400, f"{field}: the prompt is empty", param=field)
    bad = next((t for t in ids if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"{field}: token id {bad} is outside the vocabulary [0, {state.vocab_size})", param=field)
    if len(ids) >= state.context_length:
        raise ApiError(
            400,
            f"{field}: the input ({len(ids)} tokens) is longer than the model's "
            f"context length ({state.context_length} tokens)",
            param=field,
        )
    return ids


def sampling(state, sp: dict, field: str = "sampling_params") -> SamplingParams:
    """Engine sampling params from SGLang-named fields; value errors name the field."""
    cfg = state.server_cfg
    refuse_unsupported(sp, UNSUPPORTED_SAMPLING, f"{field}.")
    cap = cfg.max_new_tokens_cap
    # default fits
    n, max_new = sp.get("n", 1), sp.get("max_new_tokens", 128 if cap is None else min(128, cap))
    if n > cfg.max_n:
        raise ApiError(400, f"{field}.n must be <= {cfg.max_n}, got {n}", param=f"{field}.n")
    if cap is not None and max_new > cap:
        raise ApiError(400, f"{field}.max_new_tokens must be <= {cap}, got {max_new}", param=f"{field}.max_new_tokens")
    seed = sp.get("sampling_seed") if sp.get("sampling_seed") is not None else sp.get("seed")
    if seed is not None and not 0 <= seed < 2**63 - cfg.max_n:
        raise ApiError(400, f"{field}.sampling_seed must be in [0, 2^63), got {seed}", param=f"{field}.sampling_seed")
    stop = sp.get("stop") or []
    stop = [stop] if isinstance(stop, str) else [s for s in stop if s]
    stop_regex = sp.get("stop_regex") or []
    stop_regex = [stop_regex] if isinstance(stop_regex, str) else [s for s in stop_regex if s]
    top_k = sp.get("top_k", -1)
    top_k = -1 if top_k >= state.vocab_size else top_k  # keeping the whole vocabulary is no top-k
    try:
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            top_k=top_k,
            min_p=float(sp.get("min_p", 0.0)),
            stop=stop,
            stop_token_ids=list(sp.get("stop_token_ids") or []),
            ignore_eos=sp.get("ignore_eos", False),
            n=n,
            seed=seed,
            frequency_penalty=float(sp.get("frequency_penalty") or 0.0),
            presence_penalty=float(sp.get("presence_penalty") or 0.0),
            repetition_penalty=float(sp.get("repetition_penalty", 1.0)),
            min_new_tokens=sp.get("min_new_tokens", 0),
            logit_bias=_logit_bias(state, sp.get("logit_bias"), field),
            stop_regex=stop_regex,
        )
        check_stops(params.stop)
        compile_stop_regex(params.stop_regex)
        return params
    except ValueError as exc:
        msg = str(exc).replace("sampling_params.", f"{field}.", 1)
        raise ApiError(400, msg, param=msg.split(" ", 1)[0]) from None


async def with_grammar(state, params: SamplingParams, spec) -> SamplingParams:
    """`params` with the compiled grammar of `spec` (`grammar.grammar_source`'s), if any."""
    if spec is None:
        return params
    return dataclasses.replace(params, grammar=await compile_grammar(state, spec))


def _logit_bias(state, bias: dict | None, field: str) -> dict[int, float]:
    """SGLang's keys are token ids as strings; its message for a key outside the vocabulary."""
    out = {}
    for key, value in (bias or {}).items():
        if not key.strip().lstrip("-").isdigit() or not 0 <= int(key) < state.vocab_size:
            raise ApiError(
                400,
                f"{field}.logit_bias must has keys in [0, {state.vocab_size - 1}], got {key}.",
                param=f"{field}.logit_bias",
            )
        out[int(key)] = float(value)
    return out


def check_length(state, ids: list[int], params: SamplingParams, field: str) -> None:
    """An explicit max_new_tokens that does not fit the context after the prompt: SGLang's 400
    (not clamped)."""
    total = len(ids) + params.max_new_tokens
    if total > state.context_length:
        raise ApiError(
            400,
            f"Requested token count exceeds the model's maximum context length of "
            f"{state.context_length} tokens. You requested a total of {total} "
            f"tokens: {len(ids)} tokens from the input messages "
            f"and {params.max_new_tokens} tokens for the completion. Please reduce "
            "the number of tokens in the input messages or the completion to fit "
            "within the limit.",
            param=field,
        )


def expand(
    prompts: list[list[int]],
    params: list[SamplingParams],
    rids: list[str | None],
    logprob: list[bool],
    options: list[dict] | None = None,
) -> tuple[list[GenerateRequest], dict[str, list[str]]]:
    """n > 1 becomes n engine requests per prompt, prompt-major, with seed + j; returns the requests
    and the user rid -> engine rids groups. `options`: per prompt, GenerateRequest's
    logprob fields."""
    reqs, groups = [], {}
    for i, (ids, p, rid, lp) in enumerate(zip(prompts, params, rids, logprob)):
        base = rid or uuid.uuid4().hex
        names = [base] if p.n == 1 else [f"{base}-{j}" for j in range(p.n)]
        groups[base] = names
        for j, name in enumerate(names):
            one = dataclasses.replace(p, n=1, seed=None if p.seed is None else p.seed + j)
            try:
                reqs.append(
                    GenerateRequest(
                        rid=name, input_ids=ids, params=one, return_logprob=lp, **(options[i] if options else {})
                    )
                )
            except ValueError as exc:
                field = str(exc).split("=", 1)[0].split(" ", 1)[0]
                raise ApiError(400, str(exc), param=field) from None
    return reqs, groups


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
            raise ApiError(400, f"{field}: expected {count} entries (one per prompt), got {len(value)}", param=field)
        return value
    return [value] * count


def meta_info(track: Track, tok=None, text_in_logprobs: bool = False) -> dict:
    last, req = track.last, track.req
    info = {
        "id": req.rid,
        "finish_reason": track.finish_reason,
        "prompt_tokens": (last.prompt_tokens if last else 0) or len(req.input_ids),
        "completion_tokens": len(track.ids),
        "cached_tokens": 0,
        **(last.meta_info() if last else {"weight_version": None, "draft_weight_version": None}),
    }
    if req.return_logprob:
        info.update(logprob_fields(track, tok, text_in_logprobs))
    if track.finished:
        info["e2e_latency"] = track.finished_at - track.created
    return info


def answer_bytes(tracks: list[Track], planned: bool = False) -> int:
    """About how many bytes of JSON the logprob fields of `tracks` make (an [lp, id, null] triple
    is ~30 bytes), with the tokens generated so far or, `planned`, with max_new_tokens: what
    decides whether the answer (a stream's chunks: each holds all so far) is rendered off the
    event loop."""
    triples = 0
    for t in tracks:
        req = t.req
        if req.return_logprob:
            out = req.params.max_new_tokens if planned else len(t.ids)
            scored = out + (len(req.input_ids) if req.logprob_start_len >= 0 else 0)
            triples += scored * (1 + req.top_logprobs_num + len(req.token_ids_logprob or ()))
    return 30 * triples


def render(state, track: Track, sp: SamplingIn, text_in_logprobs: bool = False) -> dict:
    text = output_text(state.tokenizer, track, sp.skip_special_tokens, sp.no_stop_trim)
    return {
        "text": text,
        "output_ids": list(track.ids),
        "meta_info": meta_info(track, state.tokenizer, text_in_logprobs),
    }


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
        raise ApiError(400, f"{field}: the batch is empty", param=field)
    return [check_prompt(state, ids, _name(field, i, batch)) for i, ids in enumerate(raw)], batch


async def start_run(state, reqs: list[GenerateRequest], groups) -> Fanin:
    """Submit the requests and fill the prompt logprobs they asked for; nothing is left
    running on error."""
    check_logprob_volume(state, reqs)
    check_queue(state, len(reqs))
    run = Fanin(state.engine, reqs, state.metrics, state.active, groups, feed=state.feed)
    try:
        await fill_input_logprobs(state.engine, run.tracks)
    except BaseException:
        run.close()
        raise
    return run


@router.post("/generate")  # one route per method: each gets its own OpenAPI operation id
@router.put("/generate")
async def generate(request: Request):
    state = request.app.state
    body = await parse(request, GenerateIn, state.server_cfg.max_request_bytes)
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
        tracks = await collect(run, request)
        if tracks is None:
            return Response(status_code=499)

        def answer() -> Response:
            outs = [render(state, t, sp, text_lp) for t, sp in zip(tracks, per_req_sp)]
            return json_response(outs[0] if single else outs)

        # logprob options can make the answer megabytes of JSON: built on the event loop, it would
        # stall every other client's stream (and /health) for as long
        return await off_loop(answer, answer_bytes(tracks))
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


async def stream(run: Fanin, request: Request, chunks, tail=lambda: []) -> Response:
    """SSE: `chunks(i)` gives the objects to send after track i was updated, `tail()` those before
    [DONE]. 400 if the engine refuses before the first update. A client that goes away (noticed here
    even while no chunk is due, e.g. paused) ends the body, whose `finally` aborts the
    engine requests."""
    events = run.events()
    try:  # waiting for the first update (queued, paused) also ends when the client goes
        first = await unless_disconnected(anext(events), request)
    except Disconnected:
        run.close()
        return Response(status_code=499)
    except BaseException:
        run.close()
        raise

    # chunks with many logprobs render in a worker thread, as a whole answer does (`generate`);
    # safe: the tracks change only in `events`, which waits meanwhile
    size = answer_bytes(run.tracks, planned=True)

    def encoded(i: int) -> list[bytes]:
        return [sse(obj) for obj in chunks(i)]

    async def body():
        # also while no chunk is due (paused)
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            i = first
            while True:
                for data in await off_loop(encoded, size, i):
                    yield data
                nxt = asyncio.ensure_future(anext(events))
                await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    return
                i = nxt.result()
        except StopAsyncIteration:
            for obj in tail():
                yield sse(obj)
            yield SSE_DONE
        except ApiError as exc:
            yield sse(exc.body())
            yield SSE_DONE
        finally:
            gone.cancel()
            run.close()

    return StreamingResponse(body(), media_type="text/event-stream")
