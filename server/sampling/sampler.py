"""Sampling as pure tensor functions: processed probabilities, sampling with per-request generators, returned logprobs.

Logprob convention (SGLang 0.5.23's default sampler, `SGLANG_RETURN_ORIGINAL_LOGPROB` unset, read in
`python/sglang/srt/layers/sampler.py` of the installed 0.5.23): the returned logprob of a token is `log_softmax(logits /
temperature)` of the target's logits, with temperature 0 (greedy) read as 1, taken BEFORE top-k, top-p and min-p (those
shape the sampling distribution, not the returned logprob). Older SGLang renormalised over the top-p nucleus; 0.5.23
does not. The trainer must compute the same. The logits are those after the request's penalties and `logit_bias`
(below), as SGLang applies them to the logits before its sampler. `output_top_logprobs` and `output_token_ids_logprobs`
come from the same distribution.

Prompt logprobs (`input_token_logprobs` ...) are scored during the prefill: `prompt_scores.py`.

Penalties: logits processing that depends on the request and its output so far, as pure tensor functions: SGLang's
penaltylib (frequency, presence, repetition penalties; min_new_tokens) and `logit_bias`, in SGLang's order (SGLang
0.5.23's overlap path, `sampling_batch_info._apply_pre/post_grammar_logits_transforms`): additive terms (frequency,
presence, min_new_tokens' -inf on EOS and stop ids), then the repetition scaling, then `logit_bias`; temperature and the
top-k/top-p/min-p filters come after. The counts are over output tokens only, never the prompt, as SGLang's
`cumulate_output_tokens`. Speculative decoding verifies k drafts in one pass: position j of the window is processed with
the counts of the output plus drafts d_1..d_j (`window_counts`), i.e. exactly what plain decoding would have used had it
emitted those tokens, so verification is against the penalised target (lossless)."""

from __future__ import annotations

import torch

from gleanrl.server.protocol import SamplingParams
from gleanrl.server.sampling.grammar import mask_rows

Pairs = list[tuple[float, int]]  # (logprob, token id), as SGLang's logprob triples without the text


class OutputCounts:
    """Per-sequence token counts of the output so far, [V], grown incrementally (output ids only grow)."""

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu"):
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.seen = 0

    def update(self, output_ids: list[int]) -> torch.Tensor:
        new = output_ids[self.seen :]
        if new:
            idx = torch.tensor(new, dtype=torch.long, device=self.counts.device)
            self.counts.index_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
            self.seen = len(output_ids)
        return self.counts


def window_counts(counts: torch.Tensor, drafts: list[int]) -> torch.Tensor:
    """counts [V], k drafts -> [k+1, V]: row j counts the output plus drafts[:j]."""
    rows = counts[None].repeat(len(drafts) + 1, 1)
    if drafts:
        hot = torch.zeros(len(drafts), counts.shape[0], device=counts.device)
        hot[torch.arange(len(drafts)), torch.tensor(drafts, device=counts.device)] = 1.0
        rows[1:] += hot.cumsum(0)
    return rows


def penalise(
    logits: torch.Tensor,
    counts: torch.Tensor,
    out_len: torch.Tensor,
    freq: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
    min_new: torch.Tensor,
    stop_mask: torch.Tensor,
    bias: torch.Tensor,
) -> torch.Tensor:
    """logits, counts [N, V]; out_len (output tokens before the row), min_new [N] long; freq, presence, repetition [N];
    stop_mask [N, V] bool (EOS and stop ids); bias [N, V]. Returns new logits [N, V]."""
    x = logits.float() - freq[:, None] * counts - presence[:, None] * (counts > 0)
    x = x.masked_fill(stop_mask & (out_len < min_new)[:, None], float("-inf"))
    scale = torch.where(counts > 0, repetition[:, None], torch.ones_like(x))
    x = torch.where(x < 0, x * scale, x / scale)
    return x + bias


def stop_mask_row(stop_ids: set[int], vocab_size: int, device) -> torch.Tensor:
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    ids = [t for t in stop_ids if 0 <= t < vocab_size]
    if ids:
        mask[torch.tensor(ids, device=device)] = True
    return mask


def bias_row(bias: dict[int, float], vocab_size: int, device) -> torch.Tensor:
    row = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    if bias:
        row[torch.tensor(list(bias), device=device)] = torch.tensor(list(bias.values()), device=device)
    return row


def penalise_rows(
    logits: torch.Tensor,
    params: list[SamplingParams],
    counts: list[torch.Tensor],
    out_lens: list[int],
    stop_ids: list[set[int]],
) -> torch.Tensor:
    """Row-wise `penalise` from per-row params, counts [V], output lengths and min_new_tokens stop ids."""
    vocab, dev = logits.shape[-1], logits.device
    f32 = dict(dtype=torch.float32, device=dev)
    return penalise(
        logits,
        torch.stack(counts).to(dev),
        torch.tensor(out_lens, device=dev),
        torch.tensor([p.frequency_penalty for p in params], **f32),
        torch.tensor([p.presence_penalty for p in params], **f32),
        torch.tensor([p.repetition_penalty for p in params], **f32),
        torch.tensor([p.min_new_tokens for p in params], device=dev),
        torch.stack([stop_mask_row(s, vocab, dev) for s in stop_ids]),
        torch.stack([bias_row(p.logit_bias, vocab, dev) for p in params]),
    )


def params_tensors(params: list[SamplingParams], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Per-row sampling parameters as tensors [B] (top_k <= 0 means off, stored as 0)."""
    return {
        "temperature": torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        "top_k": torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.long, device=device),
        "top_p": torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        "min_p": torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
    }


def processed_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """logits [B, V]; parameters [B]. Returns the distribution actually sampled from, [B, V]: softmax(logits / T)
    restricted to top-k, then the top-p nucleus, then min-p (relative to the max), renormalised. Rows with T == 0 are
    one-hot on the argmax (greedy), so SD can treat both alike."""
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    probs = torch.softmax(logits.float() / t[:, None], dim=-1)
    if bool(((top_k > 0) | (top_p < 1) | (min_p > 0)).any()):  # else no filter: skip the sort over V
        sorted_p, order = probs.sort(dim=-1, descending=True)  # [B, V]
        rank = torch.arange(probs.shape[-1], device=probs.device)[None]
        drop = (top_k[:, None] > 0) & (rank >= top_k[:, None])
        drop |= (sorted_p.cumsum(-1) - sorted_p) > top_p[:, None]  # the top token always stays
        drop |= sorted_p < (min_p * sorted_p[:, 0])[:, None]
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """probs [B, V] -> token ids [B] (on probs' device). Each row draws from its own CPU generator (None: torch's global
    RNG), so a seeded request samples the same tokens whatever else is in the batch, on any device."""
    device, probs = probs.device, probs.cpu()
    top, out = probs.max(-1)
    for i in (top < 1.0).nonzero()[:, 0].tolist():  # one-hot rows (greedy, a collapsed nucleus): no draw
        out[i] = torch.multinomial(probs[i], 1, generator=generators[i])[0]
    return out.to(device)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [B, V], ids [B] -> log p(ids) [B], SGLang's convention (module docstring: before top-k, top-p, min-p)."""
    t = torch.where(temperature <= 0, torch.ones_like(temperature), temperature)
    logprobs = torch.log_softmax(logits.float() / t[:, None], dim=-1).gather(-1, ids[:, None])[:, 0]
    return logprobs.clamp(min=torch.finfo(logprobs.dtype).min)


def penalised(logits: torch.Tensor, seqs: list, drafts: list[list[int]] | None = None) -> torch.Tensor:
    """logits [N, V] of `seqs` (one row each, or with `drafts` one window of len(d) + 1 rows each) after each sequence's
    penalties and logit_bias; unchanged when no sequence has any. Rows of a window count the drafts before them
    (`window_counts`); then each grammar's mask, row j after drafts[:j] (`grammar.mask_rows`)."""
    drafts = drafts if drafts is not None else [[] for _ in seqs]
    if not any(s.req.params.penalised for s in seqs):
        return mask_rows(logits, seqs, drafts)
    params, counts, lens, stops = [], [], [], []
    for s, d in zip(seqs, drafts):
        if s.counts is None:
            s.counts = OutputCounts(logits.shape[-1], logits.device)
        rows = window_counts(s.counts.update(s.output_ids), d)
        params += [s.req.params] * rows.shape[0]
        counts += list(rows)
        lens += range(len(s.output_ids), len(s.output_ids) + rows.shape[0])
        stops += [s.stopper.min_new_stop_ids] * rows.shape[0]
    return mask_rows(penalise_rows(logits, params, counts, lens, stops), seqs, drafts)


def logprob_extras(logprobs: torch.Tensor, top_k: int, token_ids: list[int] | None) -> list[tuple[Pairs, Pairs]]:
    """logprobs [N, V] -> per row (the top_k (logprob, id) pairs, best first; the pairs of `token_ids`)."""
    top: list[Pairs] = [[] for _ in range(logprobs.shape[0])]
    if top_k > 0:
        vals, idx = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        top = [list(zip(v, i)) for v, i in zip(vals.tolist(), idx.tolist())]
    picked: list[Pairs] = [[] for _ in range(logprobs.shape[0])]
    if token_ids:
        vals = logprobs[:, torch.tensor(token_ids, device=logprobs.device)].tolist()
        picked = [list(zip(v, token_ids)) for v in vals]
    return list(zip(top, picked))


def record_extras(logits: torch.Tensor, seqs: list, temperature: torch.Tensor) -> None:
    """Row r of `logits` [R, V] (penalised) is the distribution of the next emitted token of `seqs[r]` (a sequence
    repeats for the several tokens a verify pass emits, in order); appends the top / token-id logprobs of the sequences
    that asked to `seq.token_extras`, aligned with output positions."""
    for b, s in enumerate(seqs):
        req = s.req
        if req.return_logprob and (req.top_logprobs_num > 0 or req.token_ids_logprob):
            t = float(temperature[b]) if float(temperature[b]) > 0 else 1.0
            lp = torch.log_softmax(logits[b : b + 1].float() / t, dim=-1)
            s.token_extras += logprob_extras(lp, req.top_logprobs_num, req.token_ids_logprob)


def sample_next(logits: torch.Tensor, seqs: list) -> list[tuple[list[int], list[float]]]:
    """logits [B, V] for B sequences -> one (token, logprob) each; the logprobs are 0.0 unless some sequence in the
    batch asked for them (`return_logprob`)."""
    if not seqs:
        return []
    logits = penalised(logits, seqs)
    want_logprobs = any(s.req.return_logprob for s in seqs)
    p = params_tensors([s.req.params for s in seqs], logits.device)
    if all(s.req.params.temperature <= 0 for s in seqs):
        ids = logits.argmax(-1)
    else:
        probs = processed_probs(logits, p["temperature"], p["top_k"], p["top_p"], p["min_p"])
        ids = sample(probs, [s.generator for s in seqs])
    lps = token_logprobs(logits, ids, p["temperature"]).tolist() if want_logprobs else [0.0] * len(seqs)
    record_extras(logits, seqs, p["temperature"])
    return [([t], [lp]) for t, lp in zip(ids.tolist(), lps)]
