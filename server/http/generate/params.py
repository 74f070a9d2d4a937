"""What the generation routes hand the engine: checked prompts, `SamplingParams` from SGLang-named fields
(value errors name the field), the compiled grammar, n samples as n engine requests, the run (`Fanin`)."""

from __future__ import annotations

import dataclasses
import uuid

from gleanrl.server.http.edge.errors import ApiError, bad_field, refuse_unsupported
from gleanrl.server.http.edge.limits import check_logprob_volume, check_queue, check_vocab
from gleanrl.server.http.generate.fanin import Fanin
from gleanrl.server.http.generate.grammar import compile_grammar
from gleanrl.server.protocol import GenerateRequest, SamplingParams
from gleanrl.server.sampling.sequence import check_stops, compile_stop_regex

UNSUPPORTED_SAMPLING = ("structural_tag",)  # a 400 naming the field unless unset


def check_prompt(state, ids: list[int], field: str) -> list[int]:
    if not ids:
        raise bad_field(field, "the prompt is empty")
    check_vocab(state, ids, field)
    if len(ids) >= state.context_length:
        raise bad_field(
            field,
            f"the input ({len(ids)} tokens) is longer than the model's context length ({state.context_length} tokens)",
        )
    return ids


def sampling(state, sp: dict, field: str = "sampling_params") -> SamplingParams:
    """Engine sampling params from SGLang-named fields; value errors name the field."""
    cfg = state.server_cfg
    refuse_unsupported(sp, UNSUPPORTED_SAMPLING, f"{field}.")
    cap = cfg.max_new_tokens_cap
    n, max_new = sp.get("n", 1), sp.get("max_new_tokens", 128 if cap is None else min(128, cap))
    if n > cfg.max_n:
        raise ApiError(400, f"{field}.n must be <= {cfg.max_n}, got {n}", param=f"{field}.n")
    if cap is not None and max_new > cap:
        raise ApiError(400, f"{field}.max_new_tokens must be <= {cap}, got {max_new}", param=f"{field}.max_new_tokens")
    seed = sp.get("sampling_seed") if sp.get("sampling_seed") is not None else sp.get("seed")
    if seed is not None and not 0 <= seed < 2**63 - cfg.max_n:
        raise ApiError(400, f"{field}.sampling_seed must be in [0, 2^63), got {seed}", param=f"{field}.sampling_seed")
    top_k = sp.get("top_k", -1)
    top_k = -1 if top_k >= state.vocab_size else top_k  # keeping the whole vocabulary is no top-k
    try:
        params = SamplingParams(
            max_new_tokens=max_new,
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            top_k=top_k,
            min_p=float(sp.get("min_p", 0.0)),
            stop=_strings(sp.get("stop")),
            stop_token_ids=list(sp.get("stop_token_ids") or []),
            ignore_eos=sp.get("ignore_eos", False),
            n=n,
            seed=seed,
            frequency_penalty=float(sp.get("frequency_penalty") or 0.0),
            presence_penalty=float(sp.get("presence_penalty") or 0.0),
            repetition_penalty=float(sp.get("repetition_penalty", 1.0)),
            min_new_tokens=sp.get("min_new_tokens", 0),
            logit_bias=_logit_bias(state, sp.get("logit_bias"), field),
            stop_regex=_strings(sp.get("stop_regex")),
        )
        check_stops(params.stop)
        compile_stop_regex(params.stop_regex)
        return params
    except ValueError as exc:
        msg = str(exc).replace("sampling_params.", f"{field}.", 1)
        raise ApiError(400, msg, param=msg.split(" ", 1)[0]) from None


def _strings(value) -> list[str]:
    value = value or []
    return [value] if isinstance(value, str) else [s for s in value if s]


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
    """An explicit max_new_tokens that does not fit the context after the prompt: SGLang's 400."""
    total, limit = len(ids) + params.max_new_tokens, state.context_length
    if total > limit:
        raise ApiError(
            400,
            f"Requested token count exceeds the model's maximum context length of {limit} tokens. You requested a "
            f"total of {total} tokens: {len(ids)} tokens from the input messages and {params.max_new_tokens} tokens "
            "for the completion. Please reduce the number of tokens in the input messages or the completion to fit "
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
    """n > 1 becomes n engine requests per prompt (prompt-major, seed + j); returns them and the user
    rid -> engine rids groups. `options`: per prompt, GenerateRequest's logprob fields."""
    reqs, groups = [], {}
    for i, (ids, p, rid, lp) in enumerate(zip(prompts, params, rids, logprob)):
        extra = options[i] if options else {}
        base = rid or uuid.uuid4().hex
        names = [base] if p.n == 1 else [f"{base}-{j}" for j in range(p.n)]
        groups[base] = names
        for j, name in enumerate(names):
            one = dataclasses.replace(p, n=1, seed=None if p.seed is None else p.seed + j)
            try:
                reqs.append(GenerateRequest(rid=name, input_ids=ids, params=one, return_logprob=lp, **extra))
            except ValueError as exc:
                field = str(exc).split("=", 1)[0].split(" ", 1)[0]
                raise ApiError(400, str(exc), param=field) from None
    return reqs, groups


def start_run(state, reqs: list[GenerateRequest], groups) -> Fanin:
    """Submit the requests (their prompt logprobs, when asked, come with their first update)."""
    check_logprob_volume(state, reqs)
    check_queue(state, len(reqs))
    return Fanin(state.engine, reqs, state.metrics, state.active, groups, feed=state.feed)
