"""`gleanrl bench sd`'s grammar and greedy-identity helpers: the grammar of `--json-schema` / `--regex` compiled as the
server compiles it, the matcher's own cost per token, and where a greedy SD output left the plain one, with the plain
engine's log-probability gap there (a near-tie, within bf16's rounding of the logits, or not)."""

from __future__ import annotations

import os
import time


def compile_grammar(engine, schema: str | None, regex: str | None):
    """The CompiledGrammar of `schema` (JSON text, a file, or 'any') or `regex` over the engine's tokenizer, or None."""
    if schema is None and regex is None:
        return None
    try:
        import xgrammar as xgr
    except ImportError:
        raise ImportError(
            "--json-schema and --regex need xgrammar: pip install 'gleanrl[grammar]' (or scripts/setup.sh)"
        ) from None
    info = xgr.TokenizerInfo.from_huggingface(
        engine.tokenizer, vocab_size=engine.info()["vocab_size"], stop_token_ids=sorted(engine.eos_ids) or None
    )
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    if schema is None:
        return compiler.compile_regex(regex)
    if schema != "any" and os.path.isfile(schema):
        with open(schema) as f:
            schema = f.read()
    return compiler.compile_builtin_json_grammar() if schema == "any" else compiler.compile_json_schema(schema)


def matcher_ms_per_token(grammar, outputs: list[list[int]], vocab: int) -> float:
    """The matcher's own work per output token (the next-token mask, then the accept), replayed."""
    from gleanrl.server.sampling.grammar import GrammarState

    tokens, start = 0, time.perf_counter()
    for out in outputs:
        state = GrammarState(grammar)
        for j in range(len(out)):
            state.window_masks([], vocab)
            state.sync(out[: j + 1])
        tokens += len(out)
    return 1000 * (time.perf_counter() - start) / max(tokens, 1)


def divergence(plain_engine, prompt: list[int], plain: list[int], sd: list[int]) -> dict:
    """Where greedy `sd` left `plain`: the position, both tokens, and the plain engine's log-probability
    gap between them there (log p(plain's) - log p(SD's), over the same prefix)."""
    at = next((i for i, (a, b) in enumerate(zip(plain, sd)) if a != b), min(len(plain), len(sd)))
    out = {"at": at, "plain": plain[at] if at < len(plain) else None, "sd": sd[at] if at < len(sd) else None}
    if out["plain"] is not None and out["sd"] is not None:
        picked = next_logprobs(plain_engine, prompt + plain[:at], [out["plain"], out["sd"]])
        out["logprob_gap"] = round(picked[0] - picked[1], 4)
    return out


def next_logprobs(engine, ids: list[int], token_ids: list[int]) -> list[float]:
    """log p(t | ids) for t in `token_ids`: a scoring request (`max_new_tokens` 0) through the engine."""
    import asyncio

    from gleanrl.server.protocol import GenerateRequest, SamplingParams

    rid, params = f"bench-sd-score-{time.monotonic_ns()}", SamplingParams(max_new_tokens=0)
    req = GenerateRequest(
        rid, ids, params, return_logprob=True, logprob_start_len=len(ids), token_ids_logprob=token_ids
    )

    async def score():
        return [out async for out in engine.generate(req)][-1].prompt_logprobs

    return asyncio.run(score()).picked[-1].tolist()
