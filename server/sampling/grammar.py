"""Structured output inside the engine: a sequence's grammar state (an xgrammar `GrammarMatcher` over the
`CompiledGrammar` the edge compiled) and the token masks it puts on the logits.

The mask is one more logits transform, applied where the penalties are (`sampler.penalised`), so every decode path sees
it: the plain step's row, and every node of an SD verify pass with the grammar state after exactly the tokens before
that node (`window_masks`, as `window_counts` for the penalties). The masked target gives a forbidden draft probability
0, so the acceptance rule never takes it (greedy: never the argmax), and SD with the mask stays distributed exactly as
plain decoding with the mask. The window's drafts are accepted into the matcher to read their masks and rolled back at
once; the tokens actually emitted are accepted by `sync`, like the penalty counts. A token the grammar refuses there (it
cannot be sampled under the mask, so a bug or a grammar error) raises, and the decode loop aborts that request alone."""

from __future__ import annotations

import torch


class GrammarError(RuntimeError):
    """An emitted token the grammar refuses; the request is aborted with this message."""


class GrammarState:
    def __init__(self, compiled):
        import xgrammar as xgr

        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.seen = 0

    def sync(self, output_ids: list[int]) -> None:
        """Accept the output tokens not yet accepted. Once terminated (a stop token matched) the grammar holds nothing
        more: later tokens (ignore_eos) are not checked."""
        for t in output_ids[self.seen :]:
            if not self.matcher.is_terminated() and not self.matcher.accept_token(t):
                raise GrammarError(f"the grammar refused output token {t} at position {self.seen}")
            self.seen += 1

    def window_masks(self, drafts: list[int], vocab_size: int) -> torch.Tensor:
        """[len(drafts) + 1, V] bool, True where allowed: row j after drafts[:j]. Rows after a draft the grammar refuses
        are never reached by verification (that draft has probability 0): they repeat the last mask. The matcher is left
        as it was."""
        xgr, m = self.xgr, self.matcher
        bits = xgr.allocate_token_bitmask(len(drafts) + 1, vocab_size)
        accepted = 0
        try:
            for j in range(len(drafts) + 1):
                if m.is_terminated():
                    bits[j].fill_(-1)  # ignore_eos past the end: unconstrained
                elif j > accepted:
                    bits[j] = bits[j - 1]
                else:
                    m.fill_next_token_bitmask(bits, j)
                    if j < len(drafts) and m.accept_token(drafts[j]):
                        accepted += 1
        finally:
            if accepted:
                m.rollback(accepted)
        return _unpack(bits, vocab_size)


def _unpack(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 bitmask [R, ceil(V/32)] -> bool [R, V] (bit i of word w: token 32 w + i)."""
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = (bits[:, :, None] >> shifts) & 1  # [R, W, 32]
    return allowed.reshape(bits.shape[0], -1)[:, :vocab_size].bool()


def mask_rows(logits: torch.Tensor, seqs: list, drafts: list[list[int]]) -> torch.Tensor:
    """logits [N, V] (one window of len(d) + 1 rows per sequence, as `sampler.penalised`) with each grammar's forbidden
    tokens at -inf; rows of sequences without a grammar unchanged."""
    if not any(s.req.params.grammar is not None for s in seqs):
        return logits
    vocab, start = logits.shape[-1], 0
    keep = torch.ones(logits.shape, dtype=torch.bool)
    for s, d in zip(seqs, drafts):
        if s.req.params.grammar is not None:
            if s.grammar is None:
                s.grammar = GrammarState(s.req.params.grammar)
            s.grammar.sync(s.output_ids)
            keep[start : start + len(d) + 1] = s.grammar.window_masks(d, vocab)
        start += len(d) + 1
    return logits.float().masked_fill(~keep.to(logits.device), float("-inf"))
